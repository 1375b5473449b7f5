"""Checkers for chapter 17: a profile's collective time, steady argument types, a step's FLOPs."""

from __future__ import annotations

import math

import numpy as np

from book import validate
from book.exercises.core import (
    Wrong,
    answered,
    checker,
    coarse,
    function,
    need,
    number_returned,
)
from book.exercises.core import shown as _shown

# Made-up runs for exercise 17.1: (device, name, start, duration) and each device's answer.
_KINDS = {"all-gather.1": "all-gather", "reduce-scatter.2": "reduce-scatter"}
_RUN = [
    (0, "all-gather.1", 0.0, 1.0),
    (0, "dot", 1.0, 2.0),
    (0, "fusion", 5.0, 1.0),  # after a gap of 2: the span is 6, the busy time 4
    (1, "dot", 0.5, 3.0),  # no collective at all
    (2, "all-gather.1", 0.0, 2.0),
    (2, "dot", 2.0, 4.0),
    (2, "reduce-scatter.2", 6.0, 2.0),
]
_SHARES = {0: 0.25, 1: 0.0, 2: 0.5}


def _ops(rows):
    from book.trace import Op

    return [Op(device, name, "jit_step", start, duration) for device, name, start, duration in rows]


def _share(ops, kinds, over_span=False):
    """The reference: per device, collective time over busy time (or over the span)."""
    busy, talking, first, last = {}, {}, {}, {}
    for op in ops:
        busy[op.device] = busy.get(op.device, 0.0) + op.duration
        talking[op.device] = talking.get(op.device, 0.0) + op.duration * (op.name in kinds)
        first[op.device] = min(first.get(op.device, op.start), op.start)
        last[op.device] = max(last.get(op.device, op.end), op.end)
    total = {d: last[d] - first[d] for d in busy} if over_span else busy
    return {d: talking[d] / total[d] if total[d] else 0.0 for d in busy}


def _close(got, want) -> bool:
    """Equal as float32 holds a share (a reader's jnp answer), as the other checkers judge."""
    try:
        return math.isclose(float(got), want, rel_tol=1e-6, abs_tol=1e-9)
    except (TypeError, ValueError, OverflowError):
        return False


def _check_shares(got, ops, kinds, where):
    want = _share(ops, kinds)
    need(
        isinstance(got, dict),
        f"collective_share returned {validate.describe(got)} for {where}; return a dict from "
        "each device to its fraction.",
    )
    missing = sorted(set(want) - set(got))
    if missing:
        first = missing[0]
        keys = "" if all(type(k) is int for k in got) else " (keys are device numbers, ints)"
        silent = " (it ran no collective: its share is 0)" if want[first] == 0.0 else ""
        raise Wrong(
            f"The answer for {where} has no entry for device {first}{silent}{keys}; give every "
            "device one."
        )
    spans = _share(ops, kinds, over_span=True)
    for device, fraction in sorted(want.items()):
        value = got[device]
        if _close(value, fraction):
            continue
        if _close(value, 100 * fraction):
            raise Wrong(f"Device {device}'s share is a percentage; return a fraction, 0 to 1.")
        if _close(value, spans[device]):
            raise Wrong(
                f"For device {device} you divided by the span from its first instruction's "
                "start to its last one's end; divide by the time its instructions ran, since "
                "a device can sit idle between them."
            )
        raise Wrong(
            f"Device {device}'s share for {where} should be {fraction:.3f}, not "
            f"{validate.describe(value)}."
        )


@checker
def ch17_collective_share(collective_share, ops, kinds):
    """Exercise 17.1: per device, the fraction of its instructions' time spent in collectives.

    First on a made-up run whose answers are known: one device idle between instructions (so
    the span and the busy time differ), one with no collective at all, one with two. Then on
    the run the chapter passes, its last traced step, against the checker's own sum.
    """
    from book.trace import Op

    made_up = _ops(_RUN)
    function(collective_share, "collective_share", (made_up, dict(_KINDS)), "(ops, kinds)")
    need(
        isinstance(ops, (list, tuple)) and all(isinstance(op, Op) for op in ops),
        f"ops should be the chapter's list of book.trace.Op rows, last, not "
        f"{validate.describe(ops)}.",
    )
    need(
        isinstance(kinds, dict),
        f"kinds should be the chapter's dict from instruction names to collectives, not "
        f"{validate.describe(kinds)}.",
    )
    got = collective_share(made_up, dict(_KINDS))
    answered(got, "collective_share returns nothing yet; return {device: fraction}")
    _check_shares(got, made_up, _KINDS, "the made-up run")
    ops, kinds = list(ops), dict(kinds)
    need(ops, "The chapter's run is empty: pass last, the ops of the last traced step.")
    _check_shares(collective_share(ops, kinds), ops, kinds, "the chapter's last step")
    shares = _share(ops, kinds)
    low, high = min(shares.values()), max(shares.values())
    return (
        f"right on the made-up run and on the chapter's step, where the devices spent "
        f"{low:.0%} to {high:.0%} of their instructions' time in collectives."
    )


@checker
def ch17_as_rate(as_rate):
    """Exercise 17.2: learning rates of every kind passed as one type, so one program.

    A Python float (what optax's ``constant_schedule`` returns), NumPy float64 and float32
    scalars, a strong float32 JAX array (what optax 0.2.8's ``linear_schedule`` returns for an
    int32 step count) and a weak one (what its ``cosine_decay_schedule`` returns) go through
    ``as_rate`` into a jitted update that counts its traces: one trace, and each rate's value
    kept to float32 precision. Then the same rates update bfloat16 weights, which must stay
    bfloat16: a strongly typed float32 rate would promote them, and the next step trace again.
    """
    import jax
    import jax.numpy as jnp

    values = {
        "0.1": 0.1,
        "np.float64(0.05)": np.float64(0.05),
        "np.float32(0.02)": np.float32(0.02),
        "jnp.float32(0.01)": jnp.float32(0.01),
        "a weakly typed jnp.asarray(0.003)": jnp.asarray(0.003),
    }
    traces = []

    def update(w, learning_rate):
        traces.append(learning_rate)
        return w - learning_rate * w

    step = jax.jit(update)
    w = jnp.ones(4, jnp.float32)
    types = {}
    function(as_rate, "as_rate", (0.1,), "(value)", classes=True)  # np.float32 converts
    for label, value in values.items():
        rate = as_rate(value)
        answered(rate, "as_rate returns nothing yet; return the rate to pass to the step")
        try:
            kind = jax.typeof(rate)
        except TypeError:
            given = validate.describe(rate)
            dtype = getattr(rate, "dtype", None)
            if isinstance(dtype, np.dtype) and dtype.kind in "fc":  # float128 and the like
                given = f"a NumPy {dtype.name} ({given})"
            raise Wrong(
                f"as_rate({label}) returned {given}, which JAX cannot pass to a step; return "
                "a Python float or a JAX scalar."
            ) from None
        need(kind.shape == (), f"as_rate({label}) has shape {kind.shape}; return one number.")
        types[label] = str(kind)
        with np.errstate(over="ignore", invalid="ignore"):  # a rate past float32's range
            out = np.asarray(step(w, rate))  # gets the sentence below, not a warning too
        want = np.float32(1) - np.float32(value)
        need(
            np.allclose(out, want, rtol=1e-6),
            f"as_rate({label}) changed the rate's value; keep the value, change only its type.",
        )
    if len(traces) > 1:
        first, *_ = values
        other = next(label for label in values if types[label] != types[first])
        raise Wrong(
            f"The step compiled {len(traces)} times: as_rate gave {types[first]} for {first} "
            f"but {types[other]} for {other}; give every kind of value the same type."
        )
    low = jnp.ones(4, jnp.bfloat16)
    for label, value in values.items():
        kind = jax.eval_shape(update, low, as_rate(value)).dtype
        need(
            kind == jnp.bfloat16,
            f"as_rate({label}) turns bfloat16 weights into {kind}: a strongly typed float32 "
            "rate promotes w - rate * g, and the next step traces again; return a weakly "
            "typed rate, which takes the weights' dtype, such as float(value).",
        )
    return (
        f"five kinds of learning rate, one type ({types['0.1']}), one compiled step, and "
        "bfloat16 weights kept bfloat16."
    )


# Sizes exercise 17.3 tries, and the one whose lowered program it counts too.
_FLOP_SIZES = ((64, 32, 48, 10), (128, 100, 30, 7), (96, 24, 40, 8))


def _remat_flops(batch, features, hidden, classes) -> int:
    """The model's products, 4BFH + 6BHC, and the forward pass recomputed, 2BFH + 2BHC."""
    return 6 * batch * features * hidden + 8 * batch * hidden * classes


def _lowered_flops(sizes) -> float | None:
    """JAX's FLOP count for its one-device step with remat, before the compiler optimises."""
    import jax

    from book import models

    params = models.init(0, sizes.features, sizes.hidden, sizes.classes)
    x, y = models.synthetic_data(1, sizes.batch, sizes.features, sizes.classes)

    def step(params, x, y):  # the loss too, as the chapter's step: grad alone skips a pass
        loss, grads = jax.value_and_grad(jax.checkpoint(models.loss))(params, x, y)
        return models.sgd(params, grads, 0.1), loss

    costs = jax.jit(step).lower(params, x, y).cost_analysis()
    if isinstance(costs, list):  # older versions give one dict per program
        costs = costs[0] if costs else {}
    return costs.get("flops") if costs else None


@checker
def ch17_step_flops(step_flops):
    """Exercise 17.3: the FLOPs of the MLP's training step with remat, 6BFH + 8BHC.

    Tried on three sizes. The usual mistakes get their own sentence: the model's FLOPs (no
    recomputation), the input's gradient counted, the forward pass alone, one device's share,
    and a multiply-add counted as one FLOP.
    """
    from book import models

    function(step_flops, "step_flops", (models.Sizes(*_FLOP_SIZES[0]),), "(sizes)")
    for dims in _FLOP_SIZES:
        sizes = models.Sizes(*dims)
        got = step_flops(sizes)
        answered(got, "step_flops returns nothing yet; return a number of FLOPs")
        value = number_returned(got, "step_flops", "a number of FLOPs")
        b, f, h, c = dims
        want = _remat_flops(*dims)
        if _close(value, want):
            continue
        coarse(got, value, want, "step_flops", 1e-9 * want)
        known = {
            4 * b * f * h + 6 * b * h * c: "that is the model's FLOPs; with remat the backward "
            "pass computes the forward pass again",
            8 * b * f * h + 8 * b * h * c: "you counted the gradient of the input x, which "
            "the step never computes: the first layer's backward needs only its weight's "
            "gradient",
            2 * b * f * h + 2 * b * h * c: "that is the forward pass alone; add the backward "
            "pass's three products and the forward pass it recomputes",
            want / 8: "that is one device's eighth; count all devices together",
            want / 2: "each multiply-add is 2 FLOPs: a product of (m, k) by (k, n) is 2mkn",
        }
        for other, why in known.items():
            if _close(value, other):
                raise Wrong(f"For {sizes}, {why}.")
        shown = _shown(value, 3 if value % 1 else 0)  # a fraction shown as one
        raise Wrong(f"For {sizes} the step's products are {want:,} FLOPs, not {shown}.")
    sizes = models.Sizes(*_FLOP_SIZES[0])
    try:
        lowered = _lowered_flops(sizes)
    except Exception:  # the count is a courtesy: the answer is judged already
        lowered = None
    said = ""
    if lowered:
        extra = lowered / _remat_flops(*sizes) - 1
        said = f"; for {tuple(sizes)} JAX's program counts {lowered:,.0f}, {extra:.1%} more"
    return f"6BFH + 8BHC on every size tried{said} (its element-wise work)."
