"""Chapter 17's checkers accept a right answer and name the plausible wrong ones in one sentence."""

import jax.numpy as jnp
import numpy as np
import pytest

from book import cost, exercises, trace


def rejected(verdict, words):
    assert not verdict.ok and verdict.judged and words in verdict.message, verdict.message
    assert "\n" not in verdict.message


# A run as the chapter passes it: two devices, one all-gather each, and compute.
RUN = [
    trace.Op(0, "all_gather.1", "jit_step", 0.0, 30.0),
    trace.Op(0, "dot", "jit_step", 30.0, 70.0),
    trace.Op(1, "all_gather.1", "jit_step", 5.0, 25.0),
    trace.Op(1, "dot", "jit_step", 40.0, 25.0),
]
KINDS = {"all_gather.1": "all-gather"}


def shares(ops, kinds, over_span=False, percent=False, skip_silent=False):
    busy, talking, first, last = {}, {}, {}, {}
    for op in ops:
        busy[op.device] = busy.get(op.device, 0.0) + op.duration
        talking[op.device] = talking.get(op.device, 0.0) + op.duration * (op.name in kinds)
        first[op.device] = min(first.get(op.device, op.start), op.start)
        last[op.device] = max(last.get(op.device, op.end), op.end)
    out = {}
    for d in busy:
        if skip_silent and not talking[d]:
            continue
        total = last[d] - first[d] if over_span else busy[d]
        out[d] = talking[d] / total * (100 if percent else 1)
    return out


def test_collective_share_accepts_the_per_device_sums():
    verdict = exercises.ch17_collective_share(shares, RUN, KINDS)
    assert verdict.ok, verdict.message
    assert "30% to 50%" in verdict.message
    in_float32 = exercises.ch17_collective_share(  # computed the JAX way: float32 shares
        lambda ops, kinds: {d: float(np.float32(v)) for d, v in shares(ops, kinds).items()},
        RUN,
        KINDS,
    )
    assert in_float32.ok, in_float32.message


@pytest.mark.parametrize(
    "answer, words",
    [
        (lambda ops, kinds: None, "Not answered yet"),
        (lambda ops, kinds: 0.3, "return a dict"),
        (lambda ops, kinds: shares(ops, kinds, over_span=True), "divided by the span"),
        (lambda ops, kinds: shares(ops, kinds, percent=True), "is a percentage"),
        (lambda ops, kinds: shares(ops, kinds, skip_silent=True), "ran no collective"),
        (lambda ops, kinds: {d: 0.5 for d in range(3)}, "should be 0.250"),
        (lambda ops, kinds: 1 / 0, "Your code raised ZeroDivisionError"),
    ],
)
def test_collective_share_names_the_usual_mistakes(answer, words):
    rejected(exercises.ch17_collective_share(answer, RUN, KINDS), words)


def test_collective_share_refuses_an_empty_run_without_blaming_the_reader():
    rejected(exercises.ch17_collective_share(shares, [], KINDS), "pass last")


def test_as_rate_accepts_one_weak_type():
    for answer in (float, lambda v: jnp.asarray(float(v))):
        verdict = exercises.ch17_as_rate(answer)
        assert verdict.ok, verdict.message
        assert "one compiled step" in verdict.message


@pytest.mark.parametrize(
    "answer, words",
    [
        (lambda v: None, "Not answered yet"),
        (lambda v: v, "compiled 2 times"),
        (jnp.asarray, "for 0.1 but float32[] for np.float64(0.05)"),
        (lambda v: "0.1", "which JAX cannot pass to a step"),
        (np.longdouble, f"a NumPy {np.dtype(np.longdouble).name} (0.1), which JAX cannot"),
        (lambda v: np.full(2, v, np.float32), "return one number"),
        (lambda v: np.float32(0.1), "changed the rate's value"),
        (np.float32, "turns bfloat16 weights into float32"),
        (jnp.float32, "turns bfloat16 weights into float32"),
    ],
)
def test_as_rate_names_the_usual_mistakes(answer, words):
    rejected(exercises.ch17_as_rate(answer), words)


def model_flops(sizes):
    b, f, h, c = sizes
    return 2 * cost.matmul_flops(b, f, h) + 3 * cost.matmul_flops(b, h, c)


def forward_flops(sizes):
    b, f, h, c = sizes
    return cost.matmul_flops(b, f, h) + cost.matmul_flops(b, h, c)


def remat_flops(sizes):
    return model_flops(sizes) + forward_flops(sizes)


def test_step_flops_accepts_the_count_and_shows_jaxs():
    verdict = exercises.ch17_step_flops(remat_flops)
    assert verdict.ok, verdict.message
    assert "6BFH + 8BHC" in verdict.message and "JAX's program counts" in verdict.message


@pytest.mark.parametrize(
    "answer, words",
    [
        (lambda s: None, "Not answered yet"),
        (lambda s: "many", "return a number"),
        (model_flops, "the model's FLOPs"),
        (lambda s: 4 * forward_flops(s), "gradient of the input x"),
        (forward_flops, "forward pass alone"),
        (lambda s: remat_flops(s) / 8, "one device's eighth"),
        (lambda s: remat_flops(s) / 2, "each multiply-add is 2 FLOPs"),
        (lambda s: remat_flops(s) + 1000, "not"),
    ],
)
def test_step_flops_names_the_usual_mistakes(answer, words):
    rejected(exercises.ch17_step_flops(answer), words)
