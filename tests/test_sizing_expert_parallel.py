"""book.sizing.plan's ep (expert parallelism) against chapter 21's dropless expert step.

The step is chapter 21's (tests/experts_step.py), compiled on 8 mock CPU devices;
tests/compiled_experts.py reads what it holds and sends.
"""

import compiled_experts
import jax
import numpy as np
import pytest

from book import cost, sizing
from book.lessons import transformer as T


@pytest.fixture(autouse=True)
def highest_precision():
    """Full-precision products, as chapter 21 sets them, for one-device comparisons."""
    with jax.default_matmul_precision("highest"):
        yield


# Chapter 21's model (chapter 13's Config, d_mlp 40 so that no kept array shares a shape with a
# parameter's shard) with two blocks, so that the layers run in a loop; 16 sequences of 12.
CFG = T.Config(n_layers=2, d_mlp=40)
BATCH, SEQ = 16, 12


def data():
    rng = np.random.default_rng(21)
    d = rng.integers(0, CFG.vocab, (BATCH, SEQ + 1), dtype=np.int32)
    return d[:, :-1], d[:, 1:]


@pytest.mark.parametrize(
    "experts, mesh_shape, axes",
    [
        (4, (2, 2, 2), ("data", "fsdp", "expert")),  # chapter 21's mesh
        (8, (8,), ("expert",)),  # one expert a device: blocks of t min(k, 1) rows
        (8, (2, 4), ("data", "expert")),
    ],
)
def test_the_plan_equals_the_compiled_expert_step(experts, mesh_shape, axes):
    compiled_experts.check_experts(CFG, experts, 2, mesh_shape, axes, *data())


MIXTRAL = sizing.Transformer(32, 4096, 14336, 32, 8, 32000, experts=8, top_k=2)


def test_mixtral_8x7b_has_its_published_parameters_and_active_flops():
    assert sizing.param_count(MIXTRAL) == 46_702_792_704  # "46.7B"
    tokens, kw = 64 * 4096, dict(global_batch=64, seq=4096)
    p = sizing.plan(MIXTRAL, ep=8, **kw)
    attention = 6 * 32 * 32 * 128 * 4096 * tokens
    active = (p.flops["model"] - attention) / (6 * tokens) + 32000 * 4096
    assert active == 12_879_925_248  # "12.9B" active: top_k = 2 experts of 8
    # Full remat: a forward pass more, of the active parameters only.
    assert p.flops["hardware"] - p.flops["model"] == pytest.approx(
        2 * (active - 32000 * 4096) * tokens + attention / 3
    )


def test_ep_memory_and_bytes_follow_the_formulas():
    m, kw = MIXTRAL, dict(global_batch=64, seq=4096)
    one, ep = sizing.plan(m, dp=8, **kw), sizing.plan(m, ep=8, **kw)
    experts = 32 * 8 * 3 * 4096 * 14336
    assert one.memory["params"] - ep.memory["params"] == experts * 7 // 8 * 4  # float32
    assert one.memory["activations"] == ep.memory["activations"]  # the batch split alike
    t = 64 * 4096 // 8
    layer = sizing.moe_all_to_all_bytes(t, top_k=2, d_model=4096, experts=8, expert_parallel=8)
    full = sum(c.sent * c.count for c in ep.collectives if c.op == "all-to-all")
    assert full == pytest.approx(32 * (2 * layer["forward"] + layer["backward"]))
    none = sizing.plan(m, ep=8, remat="none", **kw)
    a2a = sum(c.sent * c.count for c in none.collectives if c.op == "all-to-all")
    assert a2a == pytest.approx(32 * (layer["forward"] + layer["backward"]))
    # Without dp, the non-expert gradients are all-reduced over ep alone; with dp, in one
    # all-reduce over dp x ep, the experts' over dp.
    shared = 4 * (sizing.param_count(m) - experts)
    assert ep.comm["ep"] == pytest.approx(full + cost.all_reduce_bytes(shared, 8))
    assert ep.comm["dp"] == 0
    both = sizing.plan(m, dp=2, ep=4, **kw)
    over = {(c.kind, c.n) for c in both.collectives if c.op == "all-reduce"}
    assert over == {("dp", 8), ("dp", 2)}
    assert both.comm["dp"] == pytest.approx(
        cost.all_reduce_bytes(shared, 8) + cost.all_reduce_bytes(experts // 4 * 4, 2)
    )
    cap = sizing.plan(m, ep=8, capacity_factor=1.25, **kw)
    assert cap.comm["ep"] < ep.comm["ep"] and cap.memory == ep.memory  # full remat
    assert ep.seconds("H100").comm["ep"] > 0


@pytest.mark.parametrize(
    "model, kw",
    [
        (MIXTRAL, dict(ep=3)),
        (MIXTRAL, dict(ep=8, tp=2)),
        (MIXTRAL, dict(ep=2, cp=2)),
        (MIXTRAL, dict(ep=2, pp=2)),
        (MIXTRAL, dict(ep=2, dp=2, zero=1)),
        (MIXTRAL, dict(ep=2, capacity_factor=0)),
        (MIXTRAL, dict(ep=16)),
        (sizing.PRESETS["Llama 3 8B"], dict(ep=2)),
        (sizing.PRESETS["Llama 3 8B"], dict(capacity_factor=1.25)),
    ],
)
def test_ep_that_cannot_be_planned_is_refused_in_one_sentence(model, kw):
    with pytest.raises(sizing.SizingError) as e:
        sizing.plan(model, global_batch=16, seq=4096, **kw)
    assert str(e.value).count(". ") == 0


def test_a_model_with_experts_is_refused_where_it_cannot_be():
    with pytest.raises(sizing.SizingError, match="top_k=3 is more"):
        sizing.Transformer(2, 64, 128, 8, 8, 64, experts=2, top_k=3)
    with pytest.raises(sizing.SizingError, match="not planned"):
        sizing.serve(MIXTRAL, batch=8, context=1024)
