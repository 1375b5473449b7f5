"""Checkers for chapter 13: the transformer of ``book.lessons.transformer`` on several meshes."""

from __future__ import annotations

import functools
import re
import sys

import numpy as np

from book import hlo, validate
from book.errors import ReaderError
from book.exercises.core import Wrong, answered, checker, need, number
from book.exercises.core import shown as _shown

_FAST = {"xla_backend_optimization_level": 0}


def _batch(rng, cfg, batch, seq):
    pairs = rng.integers(0, cfg.vocab, (batch, 2))
    tokens = np.tile(pairs, (1, seq // 2 + 1))[:, : seq + 1].astype(np.int32)
    return tokens[:, :-1], tokens[:, 1:]


def _auto_mesh(shape, names):
    import jax
    from jax.sharding import AxisType

    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))


def _named(tree):
    """(path, logical names) for every parameter of ``PARAM_AXES``."""
    import jax

    leaves = jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda n: isinstance(n, tuple))
    return [("/".join(str(getattr(k, "key", k)) for k in path), names) for path, names in leaves]


@functools.cache
def _reference():
    """Exercise 13.1's batch and its one-device loss and gradients, computed once."""
    import jax

    from book.lessons import transformer as tr

    cfg = tr.Config()
    params = tr.init_params(cfg, seed=13)
    tokens, targets = _batch(np.random.default_rng(13), cfg, 8, 16)
    with jax.default_matmul_precision("highest"):
        one = tr.make_step(cfg).lower(params, tokens, targets).compile(_FAST)
        _, loss, grads = one(params, tokens, targets)
    return cfg, params, tokens, targets, loss, grads


@checker
def ch13_fsdp_tp_rules(rules):
    """Exercise 13.1: rules for FSDP and DP over ``data``, TP over ``model``, on 4x2."""
    import chex
    import jax

    from book.lessons import transformer as tr

    answered(rules, "set rules to a dict from logical names to mesh axes")
    need(isinstance(rules, dict), f"rules is {validate.describe(rules)}; make it a dict.")
    for name, axes in rules.items():
        listed = (axes,) if isinstance(axes, str) else axes
        need(
            axes is None
            or (isinstance(listed, tuple) and all(a in ("data", "model") for a in listed)),
            f"The rule for {validate.describe(name)} names {validate.describe(axes)}; this mesh "
            "has the axes 'data' and 'model'.",
        )
    right = {"batch": "data", "embed": "data", "heads": "model", "mlp": "model", "vocab": "model"}
    arrays = [
        ("the residual stream", tr.STREAM),
        ("the batch of tokens", ("batch", None)),
        *_named(tr.PARAM_AXES),
    ]
    for what, names in arrays:
        got, want = tr.logical_spec(names, rules), tr.logical_spec(names, right)
        if got == want:
            continue
        dims = ", ".join(repr(n) for n in names)
        raise Wrong(
            f"{what} ({dims}) gets {got}, but FSDP over data and TP over model split it as {want}."
        )
    cfg, params, tokens, targets, ref_loss, ref_grads = _reference()
    layout = tr.Layout(_auto_mesh((4, 2), ("data", "model")), dict(rules))
    with jax.default_matmul_precision("highest"):
        with hlo.compiler_messages() as log:  # the partitioner's notes, as book.layouts keeps
            mine = tr.make_step(cfg, layout).lower(params, tokens, targets).compile(_FAST)
        other = [line for line in log.lines if "rematerialization" not in line]
        if other:
            print("\n".join(other), file=sys.stderr)
        _, loss, grads = mine(params, tokens, targets)
    chex.assert_trees_all_close(loss, ref_loss, rtol=1e-5)
    chex.assert_trees_all_close(grads, ref_grads, rtol=1e-5, atol=1e-6)
    return (
        "Every parameter is split by embed over data and by heads, mlp or vocab over model, "
        "the batch over data, and one step equals one device's."
    )


def _loop_bytes(compiled):
    """Bytes each device sends in the loop bodies of a compiled step: one layer's worth."""
    import book.hlo
    from book import cost

    bodies = set(re.findall(r"body=%?([\w.\-]+)", compiled.as_text()))
    return sum(
        cost.ring_bytes(r) for r in book.hlo.collectives(compiled) if r.computation in bodies
    )


_BATCH, _SEQ = 32, 16  # exercise 13.2's batch


@functools.cache
def _tp_block_bytes():
    """What exercise 13.2's TP step sends per layer, read from its compiled loops once."""
    import jax

    from book.lessons import transformer as tr

    cfg = tr.Config()
    rules = {"heads": "model", "mlp": "model", "vocab": "model"}
    layout = tr.Layout(_auto_mesh((8,), ("model",)), rules)
    tokens, targets = _batch(np.random.default_rng(0), cfg, _BATCH, _SEQ)
    with jax.default_matmul_precision("highest"):
        step = tr.make_step(cfg, layout).lower(tr.init_params(cfg), tokens, targets)
        return _loop_bytes(step.compile(_FAST))


@checker
def ch13_block_bytes(block_bytes):
    """Exercise 13.2: bytes one device sends over ``model`` per layer, TP on 8, batch 32."""
    from book import cost
    from book.lessons import transformer as tr

    answered(block_bytes, "set block_bytes to a number of bytes")
    block_bytes = number(block_bytes, "block_bytes", "a number of bytes")
    real = _tp_block_bytes()
    batch, seq, cfg = _BATCH, _SEQ, tr.Config()
    stream = batch * seq * cfg.d_model * 4
    wrong = {
        2 * cost.all_reduce_bytes(stream, 8): "that is the forward loop only; the backward "
        "loop all-reduces the gradients of both sublayers' inputs too",
        4 * stream: "those are the sizes of the four arrays; on a ring of n devices each "
        "device sends 2(n-1)/n of an array it all-reduces",
        4 * cost.all_reduce_bytes(stream / 8, 8): "TP does not split the batch: every device "
        "of model holds all 32 sequences",
        2 * cost.all_reduce_bytes(stream, 8) * 2 * 2: "count each all-reduce once per layer",
    }
    for value, why in wrong.items():
        if abs(value - real) > 4:
            need(abs(block_bytes - value) > 4, f"Not {_shown(block_bytes)} bytes: {why}.")
    per = cost.all_reduce_bytes(stream, 8)  # one all-reduce of the stream
    count = round(real / per)
    for wrong_count in range(3, 2 * count):  # 1: read as the chapter's batch of 8, below
        extra = " (a fifth is full remat's recomputation, which this step does not do)"
        need(
            wrong_count == count or abs(block_bytes - wrong_count * per) > 4,
            f"Not {_shown(block_bytes)} bytes: that is {wrong_count} all-reduces of the stream "
            f"a layer; the compiled step has {count}, two in the forward loop and two in the "
            f"backward{extra if wrong_count == count + 1 else ''}.",
        )
    other_batch = block_bytes / real * batch  # the right count for another batch?
    if 1 <= other_batch <= 2**20 and abs(other_batch - round(other_batch)) < 1e-9:
        need(
            round(other_batch) == batch,
            f"Not {_shown(block_bytes)} bytes: that is a batch of {round(other_batch)} "
            f"sequences (the chapter's is 8 on CPU); the exercise takes {batch}.",
        )
    need(
        abs(block_bytes - real) <= 4,
        f"Not {_shown(block_bytes)} bytes: count the all-reduces per block, forward and backward, "
        "each of the residual stream (batch, seq, d_model) in float32.",
    )
    return f"{real:,.0f} bytes per device and layer, as the compiled step's loops send."


BUDGET_OF_DP = 0.6  # exercise 13.3: each device has 60% of what DP's step needs


def memory_budget() -> int:
    """Exercise 13.3's budget in bytes per device: a share of DP's step on 8 devices."""
    from book import layouts

    return round(BUDGET_OF_DP * layouts.analyze("DP", "8").total_bytes)


@checker
def ch13_memory_budget(rules, mesh_shape):
    """Exercise 13.3: a layout whose step fits in ``memory_budget()`` bytes on each device.

    The step is the chapter's, for the layout form's model and batch (``book.layouts``);
    what it needs is its arguments, outputs and temporaries per device, as
    ``memory_analysis`` counts them. The budget is a share of what DP needs, so that it means
    the same on any compiler.
    """
    from book import layouts

    answered(rules, "set rules to a dict from logical names to mesh axes")
    answered(mesh_shape, "set mesh_shape to a mesh shape such as '4x2'")
    try:
        a = layouts.analyze(rules, mesh_shape)
    except ReaderError as err:
        raise Wrong(str(err)) from None
    budget = memory_budget()
    kept = a.argument_bytes + a.output_bytes  # parameters, new parameters and gradients
    if a.total_bytes > budget:
        if kept > a.temp_bytes:
            why = "most of it is parameters, held three times (the step's input, its update "
            why += "and its gradient): split them over more devices"
        else:
            why = "most of it is temporaries, the activations of the sequences a device works "
            why += "on: split the batch, or the sequence between sublayers"
        raise Wrong(
            f"On {a.choice.where} this step needs {a.total_bytes:,} bytes per device, more "
            f"than the budget of {budget:,}; {why}."
        )
    return (
        f"On {a.choice.where} the step needs {a.total_bytes:,} bytes per device, "
        f"{a.total_bytes / budget:.0%} of the budget of {budget:,}: {kept:,} for the "
        f"parameters, their update and gradients, {a.temp_bytes:,} of temporaries."
    )
