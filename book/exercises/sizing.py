"""Checkers for chapter 18: planning a run with ``book.sizing``."""

from __future__ import annotations

from book.exercises.core import (
    Wrong,
    answered,
    checker,
    coarse,
    function,
    need,
    number_returned,
    whole,
)

# Exercise 18.1: Llama 3 8B on H100s, FSDP only, this batch.
_FIT = {"global_batch": 256, "seq": 4096}
_FIT_DEGREES = tuple(2**k for k in range(9))  # 1 to 256: every degree the batch allows
# Exercise 18.2: the cases a reader's function is called with: (model, tp, global batch, seq).
_TP_CASES = (
    ("Llama 3 8B", 8, 64, 4096),
    ("Llama 3 70B", 4, 32, 8192),
    ("Llama 3 70B", 2, 8, 2048),
)


def _fits(fsdp: int) -> bool:
    from book import sizing

    p = sizing.plan(sizing.PRESETS["Llama 3 8B"], fsdp=fsdp, **_FIT)
    return p.memory["total"] <= sizing.HARDWARE["H100"].hbm_bytes


@checker
def ch18_smallest_fsdp(fsdp):
    """Exercise 18.1: the smallest power-of-two FSDP degree at which Llama 3 8B fits an H100."""
    from book import sizing

    answered(fsdp, "set fsdp to a whole number of devices")
    fsdp = whole(fsdp, "fsdp", high=2**40, example=64)
    need(
        int(fsdp) in _FIT_DEGREES,
        f"fsdp={fsdp} is not a power of two up to 256 that splits the batch of 256 sequences.",
    )
    smallest = next(k for k in _FIT_DEGREES if _fits(k))
    total = sizing.plan(sizing.PRESETS["Llama 3 8B"], fsdp=int(fsdp), **_FIT).memory["total"]
    hbm = sizing.HARDWARE["H100"].hbm_bytes
    need(
        _fits(int(fsdp)),
        f"Not {fsdp}: the plan needs {total / 1e9:.1f} GB ({total / 2**30:.1f} GiB) per "
        f"device there, more than an H100's {hbm / 1e9:.0f} GB ({hbm / 2**30:.1f} GiB); look "
        "at which part of the memory shrinks as fsdp grows.",
    )
    need(
        int(fsdp) == smallest,
        f"Not {fsdp}: it fits, but so does fsdp={int(fsdp) // 2}; find the smallest.",
    )
    return (
        f"fsdp={smallest}: {total / 1e9:.1f} GB ({total / 2**30:.1f} GiB) per device, most "
        "of it activations, which shrink with the sequences each device holds."
    )


@checker
def ch18_tp_bytes(tp_bytes):
    """Exercise 18.2: the bytes each device sends over ``tp`` per step, without remat."""
    from book import sizing

    name, tp, batch, seq = _TP_CASES[0]
    given = (sizing.PRESETS[name], tp, batch, seq)
    function(tp_bytes, "tp_bytes", given, "(model, tp, global_batch, seq)")
    for name, tp, batch, seq in _TP_CASES:
        model = sizing.PRESETS[name]
        want = sizing.plan(model, tp=tp, global_batch=batch, seq=seq, remat="none").comm["tp"]
        given = tp_bytes(model, tp, batch, seq)
        answered(given, "tp_bytes returns None")
        got = number_returned(given, f"tp_bytes({name}, tp={tp}, ...)", "a number of bytes")
        coarse(given, got, want, "tp_bytes's answer", 1e-6 * want)
        stream = batch * seq * model.d_model * 2
        if abs(got - want) > 1e-6 * want:
            hints = {
                4 * model.layers * stream: "the all-reduces send 2(n-1)/n of the stream each",
                4 * model.layers * stream * 2 * (tp - 1) / tp: "the embedding and the "
                "unembedding all-reduce the stream once each too",
                (4 * model.layers + 2) * stream * 4 * (tp - 1) / tp: "activations are "
                "bfloat16, 2 bytes a number",
            }
            hint = next(
                (why for value, why in hints.items() if abs(got - value) <= 1e-6 * value),
                "count 4 all-reduces of the stream per layer and 2 more, each sending "
                "2(n-1)/n of it (book.cost.all_reduce_bytes)",
            )
            shown = f"{got + 0.0:,.0f}"  # -0.0 shown as 0
            raise Wrong(f"For {name} with tp={tp}: {shown} bytes, not {want:,.0f}: {hint}.")
    return "tp_bytes agrees with book.sizing.plan on every case tried."
