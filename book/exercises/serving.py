"""Checkers for chapter 20: serving with ``book.sizing.serve``."""

from __future__ import annotations

from book.exercises.core import answered, checker, coarse, need, number, whole
from book.exercises.core import shown as _shown

# Exercise 20.1: Llama 3 70B on 8 H100s, TP, this many cached tokens.
_FIT = {"context": 8192, "tp": 8}
# Exercise 20.2: chapter 20's tiny model, KV heads (TP) on 8 devices, float32, with a batch
# of 64 rather than the chapter's 8, whose table already prints its answer.
_TINY_BATCH, _TINY_LENGTH = 64, 16


def _plan(batch):
    from book import sizing

    return sizing.serve(sizing.PRESETS["Llama 3 70B"], batch=batch, **_FIT)


@checker
def ch20_largest_batch(batch, per_chip):
    """Exercise 20.1: the largest batch that fits, and its tokens per second per chip."""
    from book import sizing

    answered(batch, "set batch to a whole number of sequences")
    batch = whole(batch, "batch", high=2**20, example=32)
    hbm = sizing.HARDWARE["H100"].hbm_bytes
    largest = 1
    while _plan(largest + 1).memory["total"] <= hbm:
        largest += 1
    total = _plan(batch).memory["total"]
    need(
        total <= hbm,
        f"Not {batch}: the plan needs {total / 1e9:.1f} GB per chip, more than an H100's "
        f"{hbm / 1e9:.0f} GB; the cache grows with every sequence.",
    )
    need(batch == largest, f"Not {batch}: it fits, but so does {batch + 1}; find the largest.")
    answered(per_chip, "set per_chip to the tokens per second per chip at that batch")
    given, per_chip = per_chip, number(per_chip, "per_chip")
    want = _plan(largest).decode_seconds("H100").per_chip
    coarse(given, per_chip, want, "per_chip", 1e-3 * want)  # 16 bits hold 3 digits at most
    need(
        abs(per_chip - want) <= 1e-3 * want,
        f"The batch is right, but per_chip is {_shown(per_chip, 1)}, not {want:,.1f}: use "
        "decode_seconds('H100').per_chip of that plan.",
    )
    return (
        f"batch={largest}: {total / 1e9:.1f} GB per chip and {want:,.0f} tokens/s per chip, "
        "the step a read of almost the whole HBM."
    )


@checker
def ch20_tp_token_bytes(tp_layer_bytes):
    """Exercise 20.2: TP's bytes per device and decoded token, in the layers."""
    from book import sizing
    from book.lessons.planning import small_model
    from book.lessons.transformer import Config

    answered(tp_layer_bytes, "set tp_layer_bytes to a number of bytes")
    got = number(tp_layer_bytes, "tp_layer_bytes")
    plan = sizing.serve(
        small_model(Config()),
        batch=_TINY_BATCH,
        context=_TINY_LENGTH,
        tp=8,
        param_dtype="float32",
        cache_dtype="float32",
        compute_dtype="float32",
    )
    want = sum(c.sent * c.count for c in plan.collectives if c.in_layers)
    stream = _TINY_BATCH * Config().d_model * 4
    hints = {
        2 * Config().n_layers * stream: "each all-reduce sends 2(n-1)/n of the stream",
        4 * Config().n_layers * stream * 7 / 4: "a decode step has the forward pass's two "
        "all-reduces a layer, not a training step's four",
        want * 8 / _TINY_BATCH: "that is the chapter's batch of 8; the stream grows with the batch",
        want / 2: "that is half: a ring all-reduce sends 2(n-1)/n of the stream, not (n-1)/n",
        want * 8 / 7: "a ring all-reduce sends 2(n-1)/n of the stream, not twice all of it",
    }
    hint = next(
        (why for value, why in hints.items() if abs(got - value) <= 1e-6 * value),
        "count the all-reduces of the (batch, 1, d_model) stream in one layer's forward pass",
    )
    need(abs(got - want) <= 1e-6 * want, f"Not {_shown(got)} bytes, but {want:,.0f}: {hint}.")
    return f"{want:,.0f} bytes: two all-reduces of the new tokens' stream per layer."
