"""book.sizing: published parameter counts, the formulas' scaling, time bounds and refusals."""

import dataclasses
import math

import pytest

from book import cost, sizing
from book.errors import ReaderError

LLAMA_8B, LLAMA_70B = sizing.PRESETS["Llama 3 8B"], sizing.PRESETS["Llama 3 70B"]


def test_published_parameter_counts():
    # Meta's model cards: 8.03B and 70.6B parameters.
    assert sizing.param_count(LLAMA_8B) == 8_030_261_248
    assert sizing.param_count(LLAMA_70B) == 70_553_706_496
    assert round(sizing.param_count(LLAMA_8B) / 1e9, 2) == 8.03
    assert round(sizing.param_count(LLAMA_70B) / 1e9, 1) == 70.6


def _plan(**kw):
    return sizing.plan(LLAMA_8B, global_batch=64, seq=4096, **kw)


def test_state_scales_with_sharding_not_with_dp():
    one = _plan()
    n = sizing.param_count(LLAMA_8B)
    assert one.memory["params"] == 4 * n and one.memory["grads"] == 4 * n
    assert one.memory["optimizer"] == 8 * n + 4  # two float32 moments and a step count
    assert _plan(dp=8).memory["params"] == one.memory["params"]
    assert _plan(fsdp=8).memory["params"] == one.memory["params"] // 8  # all sizes divide
    tp = _plan(tp=8).memory["params"]
    norms = (2 * LLAMA_8B.layers + 1) * LLAMA_8B.d_model  # TP keeps the norms whole
    assert tp == 4 * ((n - norms) // 8 + norms)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_communication_follows_the_ring_formulas(n):
    grads = 4 * sizing.param_count(LLAMA_8B)
    assert _plan(dp=n).comm["dp"] == pytest.approx(cost.all_reduce_bytes(grads, n))
    # FSDP: every weight gathered twice and its gradient reduce-scattered: 3 (n-1)/n P.
    assert _plan(fsdp=n).comm["fsdp"] == pytest.approx(3 * (n - 1) / n * grads)
    stream = 64 * 4096 * LLAMA_8B.d_model * 2  # bfloat16 activations
    n = min(n, LLAMA_8B.kv_heads)  # TP splits by K/V head: at most 8 ways
    # TP: 4 all-reduces of the stream a layer, a fifth under full remat (the default), and 2.
    tp = cost.all_reduce_bytes(stream, n) * (5 * LLAMA_8B.layers + 2)
    assert _plan(tp=n).comm["tp"] == pytest.approx(tp)
    tp = cost.all_reduce_bytes(stream, n) * (4 * LLAMA_8B.layers + 2)
    assert _plan(tp=n, remat="none").comm["tp"] == pytest.approx(tp)
    # Sequence parallelism: the recomputation gathers each layer's input once more.
    gather = cost.all_gather_bytes(stream, n) * LLAMA_8B.layers
    sp = _plan(tp=n, sequence_parallel=True).comm["tp"]
    assert sp == pytest.approx(_plan(tp=n).comm["tp"] + gather)
    assert _plan(dp=n).comm["tp"] == _plan(tp=n).comm["dp"] == 0


@pytest.mark.parametrize("params, grads", [("float32", "float32"), ("bfloat16", "float32")])
def test_zero1_splits_the_optimizer_over_dp(params, grads):
    kw = dict(dp=8, tp=2, param_dtype=params, grad_dtype=grads)
    dp, zero1 = _plan(**kw), _plan(zero=1, **kw)
    assert zero1.conventions["zero"] == 1 and dp.conventions["zero"] == 0
    # AdamW's two float32 moments of what a device holds, split 8 ways; the step count whole.
    held = dp.memory["grads"] // 4
    assert zero1.memory["optimizer"] == 8 * math.ceil(held / 8) + 4
    for part in ("params", "grads", "activations"):
        assert zero1.memory[part] == dp.memory[part]
    # A reduce-scatter of the gradients and an all-gather of the parameters, in their dtypes:
    # with both in float32, what the all-reduce sent.
    sent = cost.reduce_scatter_bytes(held * 4, 8) + cost.all_gather_bytes(held * 2, 8)
    if params == "float32":
        sent += cost.all_gather_bytes(held * 2, 8)
        assert zero1.comm["dp"] == pytest.approx(dp.comm["dp"])
    assert zero1.comm["dp"] == pytest.approx(sent)
    assert {c.op for c in zero1.collectives if c.kind == "dp"} == {
        "reduce-scatter",
        "all-gather",
    }
    assert zero1.comm["tp"] == dp.comm["tp"] and zero1.flops == dp.flops
    # Without DP there is nothing to split.
    assert _plan(tp=2, zero=1).memory == _plan(tp=2).memory


def test_zero2_splits_the_gradients_and_reduces_each_microbatchs():
    kw = dict(dp=8, tp=2, microbatches=4)
    zero1, zero2 = _plan(zero=1, **kw), _plan(zero=2, **kw)
    held = zero1.memory["grads"] // 4
    assert zero2.memory["grads"] == 4 * math.ceil(held / 8)
    for part in ("params", "optimizer", "activations"):
        assert zero2.memory[part] == zero1.memory[part]
    # The gradients' reduce-scatters run once per microbatch; the parameters' gathers once.
    scatter = cost.reduce_scatter_bytes(held * 4, 8)
    assert zero2.comm["dp"] - zero1.comm["dp"] == pytest.approx(3 * scatter)
    assert _plan(zero=2, dp=8).comm == _plan(zero=1, dp=8).comm  # one microbatch: the same


def test_tp_bytes_grow_with_the_batch_and_dp_bytes_do_not():
    a = sizing.plan(LLAMA_8B, dp=2, tp=4, global_batch=64, seq=2048)
    b = sizing.plan(LLAMA_8B, dp=2, tp=4, global_batch=128, seq=2048)
    assert b.comm["tp"] == pytest.approx(2 * a.comm["tp"])
    assert b.comm["dp"] == a.comm["dp"]


def test_pipeline_sends_every_schedule_step():
    p = sizing.plan(LLAMA_70B, pp=4, global_batch=32, seq=4096, microbatches=8)
    stream = 32 // 8 * 4096 * LLAMA_70B.d_model * 2
    sent = {}
    for c in p.collectives:
        if c.kind == "pp":
            sent[c.op] = sent.get(c.op, 0) + c.sent * c.count
    assert sent["collective-permute"] == 2 * (8 + 4 - 1) * stream
    # The final norm's and unembedding's float32 gradients, and the embedded tokens' bfloat16
    # gradient: the ends are replicated over the stages.
    head = LLAMA_70B.vocab * LLAMA_70B.d_model + LLAMA_70B.d_model
    reduced = cost.all_reduce_bytes(4 * head, 4) + cost.all_reduce_bytes(8 * stream, 4)
    assert sent["all-reduce"] == pytest.approx(reduced)
    assert (
        p.memory["params"] < sizing.plan(LLAMA_70B, global_batch=32, seq=4096).memory["params"] / 3
    )


@pytest.mark.parametrize("m, p", [(8, 4), (2, 4), (4, 4)])
def test_1f1b_keeps_at_most_pp_microbatches_and_sends_as_gpipe(m, p):
    kw = dict(pp=p, tp=8, global_batch=32, seq=4096, microbatches=m, sequence_parallel=True)
    gpipe, one_f = sizing.plan(LLAMA_70B, **kw), sizing.plan(LLAMA_70B, schedule="1f1b", **kw)
    assert gpipe.conventions["schedule"] == "gpipe" and one_f.conventions["schedule"] == "1f1b"
    per_microbatch = gpipe.memory["activations"] // m
    assert one_f.memory["activations"] == per_microbatch * min(m, p)
    for part in ("params", "grads", "optimizer"):
        assert one_f.memory[part] == gpipe.memory[part]
    assert one_f.comm == gpipe.comm and one_f.flops == gpipe.flops  # same steps, same bubble
    # Without a pipeline there is no schedule to choose: one microbatch's activations.
    flat = dict(tp=8, global_batch=32, seq=4096, microbatches=m)
    assert sizing.plan(LLAMA_70B, schedule="1f1b", **flat).memory == (
        sizing.plan(LLAMA_70B, **flat).memory
    )


def test_remat_trades_memory_for_recomputed_flops():
    full, minimal, none = (_plan(remat=r) for r in ("full", "minimal", "none"))
    kept = [p.memory["activations"] for p in (full, minimal, none)]
    assert kept == sorted(kept) and len(set(kept)) == 3
    assert full.memory["total"] == sum(v for k, v in full.memory.items() if k != "total")
    # Minimal remat recomputes the attention's two products forward: a third of their FLOPs.
    m, seq, tokens = LLAMA_8B, minimal.seq, minimal.global_batch * minimal.seq
    scores = 6 * m.layers * m.heads * m.head_dim * seq * tokens
    assert minimal.flops["hardware"] == pytest.approx(none.flops["hardware"] + scores / 3)
    assert full.flops["hardware"] > minimal.flops["hardware"] > none.flops["model"]
    assert none.flops["hardware"] == none.flops["model"]
    # A gated MLP keeps both input products, gate and up; a GELU MLP its one (bfloat16).
    plain = dataclasses.replace(m, gated=False)
    kept_plain = sizing.plan(plain, remat="minimal", global_batch=64, seq=4096).memory
    extra = m.layers * tokens * m.d_ff * 2
    assert minimal.memory["activations"] - kept_plain["activations"] == extra


def test_seconds_bound_and_links():
    p = sizing.plan(LLAMA_70B, fsdp=32, tp=8, global_batch=256, seq=4096)
    s = p.seconds(sizing.HARDWARE["H100"])
    assert s.links["tp"] == "NVLink" and s.links["fsdp"] == "InfiniBand"
    assert s.bound == max(s.compute, *s.comm.values())
    assert s.serial >= s.bound and 0 < s.mfu <= 1
    one = next(c for c in p.collectives if c.kind == "tp" and c.in_layers)
    link = sizing.HARDWARE["H100"].fast
    steps = cost.ring_steps("all-reduce", 8)
    each = cost.collective_seconds(one.sent, steps, link.bandwidth, link.hop_latency)
    assert s.comm["tp"] >= one.count * each
    assert p.seconds("TPU v5p").links["fsdp"] == "ICI"  # 256 chips: one slice


def test_hardware_has_sources():
    assert set(sizing.HARDWARE) == {"TPU v5e", "TPU v5p", "TPU v6e", "H100", "H200"}
    for hw in sizing.HARDWARE.values():
        assert hw.source.startswith("https://")
        for link in (hw.fast, hw.slow):
            assert "https://" in link.source and link.bandwidth > 0 and link.hop_latency > 0
        assert hw.fast.bandwidth > hw.slow.bandwidth


@pytest.mark.parametrize(
    "call",
    [
        lambda: sizing.plan("Llama", global_batch=8, seq=8),
        lambda: sizing.plan(LLAMA_8B, dp=0, global_batch=8, seq=8),
        lambda: sizing.plan(LLAMA_8B, dp=3, global_batch=8, seq=8),
        lambda: sizing.plan(LLAMA_8B, pp=5, global_batch=8, seq=8),
        lambda: sizing.plan(LLAMA_8B, global_batch=8, seq=8, remat="some"),
        lambda: sizing.plan(LLAMA_8B, pp=2, global_batch=8, seq=8, schedule="zero bubble"),
        lambda: sizing.plan(LLAMA_8B, global_batch=8, seq=8, param_dtype="fp32"),
        lambda: sizing.plan(LLAMA_8B, dp=True, global_batch=8, seq=8),
        lambda: sizing.plan(LLAMA_8B, dp=1024, fsdp=1024, global_batch=2**20, seq=8),
        lambda: sizing.Transformer(2, 64, 128, 6, 4, 64),
        lambda: sizing.Transformer(2, 64, 128, 16, 8, 64, gated="yes"),
        lambda: _plan().seconds("TPU v9"),
        lambda: _plan().links(8.0),  # only a chip has links
        lambda: sizing.serve(LLAMA_8B, batch=8, context=64).links(b"H100"),
        lambda: sizing.plan(LLAMA_8B, tp=16, global_batch=8, seq=8),  # 8 K/V heads
        lambda: sizing.plan(LLAMA_8B, global_batch=8, seq=2**31 - 1),
        lambda: sizing.plan(LLAMA_8B, dp=2, global_batch=8, seq=8, zero=True),
        lambda: sizing.plan(LLAMA_8B, dp=2, global_batch=8, seq=8, zero=3),
    ],
)
def test_refusals_are_one_sentence(call):
    with pytest.raises(ReaderError) as err:
        call()
    message = str(err.value)
    assert message.endswith(".") and "\n" not in message and len(message) < 300
    assert math.isfinite(len(message))


def _chapter_13_batch(n_layers=None):
    """Chapter 13's configuration (with n_layers layers) and 16 sequences of 16 tokens."""
    import dataclasses

    import numpy as np

    from book.lessons.transformer import Config

    cfg = Config() if n_layers is None else dataclasses.replace(Config(), n_layers=n_layers)
    rng = np.random.default_rng(0)
    sequences = rng.integers(0, cfg.vocab, (16, 17)).astype(np.int32)
    return cfg, sequences[:, :-1], sequences[:, 1:]


# Chapter 13's step in its layouts DP, FSDP, TP and FSDP x TP (chapter 18 shows TP beside its
# plan): the state equal byte for byte, activations and the ends' bytes within stated bounds,
# the layers' bytes equal (compiled_plans.check_layout asserts each). DP x FSDP x TP is left
# out: there the CPU compiler merges gradient reductions over two axes, which no per-axis count
# can match.
@pytest.mark.slow
@pytest.mark.parametrize(
    "name, mesh_shape", [("DP", (8,)), ("FSDP", (8,)), ("TP", (8,)), ("FSDP x TP", (4, 2))]
)
def test_the_plan_equals_the_compiled_step(name, mesh_shape):
    import compiled_plans
    import jax

    from book import hlo
    from book.lessons.transformer import init_params

    cfg, tokens, targets = _chapter_13_batch()
    leaves = jax.tree.leaves(init_params(cfg))
    assert sizing.param_count(compiled_plans.small_model(cfg)) == sum(a.size for a in leaves)
    with hlo.compiler_messages() as xla_log:
        degrees, got, plans = compiled_plans.check_layout(cfg, name, mesh_shape, tokens, targets)
    assert got["params"] == plans["full"].memory["params"]
    # Whatever XLA logged (FSDP x TP: an array gathered whole and split again, slower and
    # still correct, its bytes counted) is the partitioner's note on rematerializing an array.
    assert all("rematerialization" in line for line in xla_log.lines)


# TP with sequence parallelism: what each remat policy keeps, against the plan.
@pytest.mark.slow
@pytest.mark.parametrize("tp", [4, 8])
def test_sequence_parallel_activations_match_the_compiled_residuals(tp):
    import compiled_plans

    cfg, tokens, targets = _chapter_13_batch()
    compiled_plans.check_sequence_parallel(cfg, tp, tokens, targets)


# Chapter 14's pipeline of the same transformer, alone and with each layout inside its stages
# (compiled_plans.check_pipeline asserts every byte of it).
@pytest.mark.slow
@pytest.mark.parametrize(
    "mesh_shape, axes",
    [
        ((8,), ("stage",)),
        ((2, 4), ("data", "stage")),
        ((2, 4), ("fsdp", "stage")),
        ((2, 4), ("model", "stage")),
        ((2, 2, 2), ("fsdp", "model", "stage")),
    ],
)
def test_the_plan_equals_the_compiled_pipeline_step(mesh_shape, axes):
    import compiled_plans

    cfg, tokens, targets = _chapter_13_batch(n_layers=8)
    m = 4
    degrees, got, plan = compiled_plans.check_pipeline(cfg, mesh_shape, axes, m, tokens, targets)
    p = degrees["pp"]
    assert p == mesh_shape[-1]
    steps = m + p - 1  # each sends a microbatch's stream forward and back
    split = degrees.get("dp", 1) * degrees.get("fsdp", 1)
    stream = 16 // (m * split) * 16 * cfg.d_model * 4
    assert got["permutes"] == pytest.approx(2 * steps * stream)
    assert got["params"] == plan.memory["params"] and got["grads"] == plan.memory["grads"]
    if "tp" in degrees:  # five all-reduces of the stream per layer, at every step
        layers = cfg.n_layers // p
        per_layer = 5 * sum(cost.all_reduce_bytes(stream, 2) for _ in range(steps))
        assert got["loops"]["tp"] == pytest.approx(layers * per_layer)


H100 = sizing.HARDWARE["H100"]


@pytest.mark.parametrize(
    "chip, link",
    [
        ({"peak_flops": 0}, None),
        ({"peak_flops": -1e12}, None),
        ({"peak_flops": float("nan")}, None),
        ({"peak_flops": "989e12"}, None),
        ({"hbm_bytes": -1}, None),
        ({"hbm_bytes": float("inf")}, None),
        ({"slow": None}, None),
        ({"domain": 0}, None),
        ({"domain": -8}, None),
        ({"domain": 8.5}, None),
        ({"domain": float("nan")}, None),
        ({"name": None}, None),
        (None, {"bandwidth": 0}),
        (None, {"bandwidth": -5}),
        (None, {"bandwidth": float("nan")}),
        (None, {"hop_latency": -1}),
        (None, {"hop_latency": float("nan")}),
        (None, {"hop_latency": True}),
        ({"peak_flops": 1e308}, None),  # 8 chips' total overflows: compute in 0 seconds
        (None, {"bandwidth": 1e300}),
        (None, {"hop_latency": 1e308}),  # every collective would take forever
    ],
)
def test_hardware_and_links_refuse_what_no_chip_has(chip, link):
    import dataclasses

    with pytest.raises(sizing.SizingError) as err:
        if chip is not None:
            dataclasses.replace(H100, **chip)
        else:
            dataclasses.replace(H100.fast, **link)
    message = str(err.value)
    assert message.endswith(".") and "\n" not in message and len(message) < 300


def test_hardware_built_from_wrong_kinds_is_refused_and_zero_latency_is_not():
    import dataclasses

    with pytest.raises(sizing.SizingError, match="peak FLOP/s"):
        sizing.Hardware("x", "y", "z", None, None, "8", "s")
    fast = dataclasses.replace(H100.fast, hop_latency=0)
    s = _plan(tp=8).seconds(dataclasses.replace(H100, fast=fast, peak_flops=1e15))
    assert 0 < s.mfu <= 1 and s.links["tp"] == "NVLink"


# A fused attention kernel keeps no scores: against a custom_vjp attention that keeps what
# FlashAttention's backward keeps, without remat, on 4 devices of TP.
@pytest.mark.slow
def test_fused_attention_activations_match_the_compiled_residuals(monkeypatch):
    import compiled_plans

    cfg, tokens, targets = _chapter_13_batch()
    compiled_plans.check_fused_attention(cfg, 4, tokens, targets, monkeypatch)


def test_fused_attention_keeps_no_scores_and_computes_them_again():
    kw = dict(remat="none", global_batch=64, seq=8192)
    plain, fused = (sizing.plan(LLAMA_8B, fused_attention=f, **kw) for f in (False, True))
    m, tokens = LLAMA_8B, fused.global_batch * fused.seq
    softmax = m.layers * tokens * (2 * m.heads * fused.seq + m.heads) * 2  # bfloat16
    assert plain.memory["activations"] - fused.memory["activations"] == softmax
    scores = 6 * m.layers * m.heads * m.head_dim * fused.seq * tokens
    assert fused.flops["hardware"] == pytest.approx(plain.flops["hardware"] + scores / 6)
    assert fused.flops["model"] == plain.flops["model"] and fused.comm == plain.comm
    for remat in ("full", "minimal"):  # the scores were never kept; the FLOPs still grow
        a, b = _plan(remat=remat), _plan(remat=remat, fused_attention=True)
        assert a.memory == b.memory and b.flops["hardware"] > a.flops["hardware"]


@pytest.mark.parametrize("m, p, v", [(8, 4, 2), (16, 4, 4), (4, 4, 2)])
def test_interleaved_1f1b_holds_chapter_14s_peak_for_a_smaller_bubble(m, p, v):
    from fractions import Fraction

    kw = dict(pp=p, tp=8, global_batch=32, seq=4096, microbatches=m, sequence_parallel=True)
    one_f = sizing.plan(LLAMA_70B, schedule="1f1b", **kw)
    inter = sizing.plan(LLAMA_70B, schedule="interleaved", virtual_stages=v, **kw)
    # Stage 0 holds at most p + (p - 1) / v microbatches (chapter 14's simulated peak), and
    # never more than all m of them.
    per_microbatch = Fraction(one_f.memory["activations"], min(m, p))
    peak = min(p + Fraction(p - 1, v), m)
    assert inter.memory["activations"] == math.floor(per_microbatch * peak)
    # The bubble falls by v; every step sends, v m + p - 1 of them, both ways.
    bubble = Fraction(inter.flops["hardware"]) / Fraction(one_f.flops["hardware"])
    assert bubble == pytest.approx((m + (p - 1) / v) / (m + p - 1))
    stream = 32 // m * 4096 * LLAMA_70B.d_model * 2  # a microbatch's, in bfloat16
    sends = [c for c in inter.collectives if c.op == "collective-permute"]
    # Under SP each of the 8 TP ranks sends its eighth of the sequence.
    assert sum(c.sent * c.count for c in sends) == 2 * (v * m + p - 1) * stream / 8
    whole = sizing.plan(LLAMA_70B, **{**kw, "sequence_parallel": False})
    sends = [c for c in whole.collectives if c.op == "collective-permute"]
    assert sum(c.sent * c.count for c in sends) == 2 * (m + p - 1) * stream
    for part in ("params", "grads", "optimizer"):
        assert inter.memory[part] == one_f.memory[part]


@pytest.mark.parametrize(
    "schedule, v, layers",
    [("interleaved", 1, 80), ("1f1b", 2, 80), ("interleaved", 3, 80), ("interleaved", 2, 12)],
)
def test_interleaving_is_asked_for_consistently(schedule, v, layers):
    model = dataclasses.replace(LLAMA_70B, layers=layers)
    with pytest.raises(ReaderError) as err:
        sizing.plan(model, pp=4, global_batch=32, seq=64, schedule=schedule, virtual_stages=v)
    assert "\n" not in str(err.value) and "virtual_stages" in str(err.value)


def test_interleaving_fewer_microbatches_than_stages_is_refused():
    # A microbatch's second trip would start before its first had come round: no schedule.
    with pytest.raises(ReaderError, match="at least pp=4 microbatches") as err:
        sizing.plan(
            LLAMA_70B,
            pp=4,
            global_batch=32,
            seq=64,
            microbatches=2,
            schedule="interleaved",
            virtual_stages=2,
        )
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("tp, most", [(1, 3), (4, 2)])  # TP on the torus takes a dimension
def test_an_ici_axis_over_several_torus_dimensions_sends_that_much_faster(tp, most):
    p = sizing.plan(LLAMA_70B, fsdp=4096 // tp, tp=tp, global_batch=4096, seq=4096)
    one = p.seconds("TPU v5p")
    for dims in range(1, most + 1):
        s = p.seconds("TPU v5p", torus={"fsdp": dims})
        assert s.compute == one.compute and s.comm["tp"] == one.comm["tp"]
        # Bytes over dims times the bandwidth; the hops' latency unchanged.
        latency = sum(
            c.count * cost.ring_steps(c.op, c.n) * sizing.HARDWARE["TPU v5p"].fast.hop_latency
            for c in p.collectives
            if c.kind == "fsdp"
        )
        assert s.comm["fsdp"] - latency == pytest.approx((one.comm["fsdp"] - latency) / dims)
    assert [sizing.HARDWARE[n].torus_dims for n in ("TPU v5e", "TPU v5p", "TPU v6e")] == [2, 3, 2]
    assert sizing.HARDWARE["H100"].torus_dims == 1


@pytest.mark.parametrize(
    "chip, torus",
    [
        ("TPU v5p", {"fsdp": 4}),  # v5p's torus has 3 dimensions
        ("H100", {"fsdp": 2}),  # NVLink's switch is no torus
        ("TPU v5p", {"tp": 3}),  # 4 devices span at most 2
        ("TPU v5p", {"model": 2}),
        ("TPU v5p", [("fsdp", 2)]),
        ("TPU v5p", {"fsdp": True}),
        ("TPU v5p", {"fsdp": 3, "tp": 2}),  # the same links counted twice
        ("TPU v5p", {"fsdp": 3}),  # and TP's 4 devices on the torus take a third
    ],
)
def test_a_torus_that_cannot_be_is_refused_in_one_sentence(chip, torus):
    p = sizing.plan(LLAMA_70B, fsdp=1024, tp=4, global_batch=1024, seq=4096)
    with pytest.raises(ReaderError) as err:
        p.seconds(chip, torus=torus)
    assert "\n" not in str(err.value)
    dcn = sizing.plan(LLAMA_70B, dp=2, fsdp=4096, global_batch=8192, seq=64)
    with pytest.raises(ReaderError, match="DCN"):
        dcn.seconds("TPU v5p", torus={"dp": 2})


def test_a_torus_of_a_dict_subclass_is_read_for_what_it_holds():
    class Lying(dict):
        def items(self):
            raise RuntimeError("items")

    p = sizing.plan(LLAMA_70B, fsdp=1024, tp=4, global_batch=1024, seq=4096)
    same = p.seconds("TPU v5p", torus=Lying(fsdp=2))
    assert same == p.seconds("TPU v5p", torus={"fsdp": 2})


def test_an_axis_crossing_domains_uses_the_links_the_axes_inside_leave_it():
    h100, v5e = sizing.HARDWARE["H100"], sizing.HARDWARE["TPU v5e"]
    for tp, cards in ((1, 8), (2, 4), (8, 1)):  # FSDP's devices on each 8-GPU board
        p = sizing.plan(LLAMA_70B, fsdp=1024 // tp, tp=tp, global_batch=1024, seq=64)
        link = p.links(h100)["fsdp"]
        assert link.name == "InfiniBand" and link.bandwidth == cards * h100.slow.bandwidth
        # One hop in `cards` leaves the board; the others run over NVLink.
        hops = (h100.slow.hop_latency + (cards - 1) * h100.fast.hop_latency) / cards
        assert link.hop_latency == pytest.approx(hops)
    # A ring through a slice never runs faster than its ICI, however wide the DCN.
    p = sizing.plan(LLAMA_8B, fsdp=512, global_batch=1024, seq=64)
    assert p.links(v5e)["fsdp"].name == "DCN"
    assert p.links(v5e)["fsdp"].bandwidth == v5e.fast.bandwidth < 256 * v5e.slow.bandwidth
    assert sizing.plan(LLAMA_8B, tp=8, dp=2, global_batch=64, seq=64).links(h100)["dp"] is (
        h100.slow
    )


def test_a_prime_number_of_devices_spans_one_torus_dimension():
    for n in (5, 7, 11, 13):
        p = sizing.plan(LLAMA_8B, fsdp=n, global_batch=16 * n, seq=2048)
        with pytest.raises(ReaderError, match="cannot span 2 dimensions"):
            p.seconds("TPU v5e", torus={"fsdp": 2})
    twelve = sizing.plan(LLAMA_8B, fsdp=12, global_batch=48, seq=2048)
    assert twelve.seconds("TPU v5p", torus={"fsdp": 3}).comm["fsdp"] > 0  # 2 x 2 x 3


def test_axes_of_one_device_or_on_slow_links_take_no_torus_dimension():
    p = sizing.plan(LLAMA_8B, tp=4, fsdp=4, global_batch=64, seq=2048)  # dp = pp = 1
    named = p.seconds("TPU v5e", torus={"fsdp": 1, "tp": 1, "dp": 1, "pp": 1})
    assert named.bound == p.seconds("TPU v5e", torus={"fsdp": 1, "tp": 1}).bound
    over_dcn = sizing.plan(LLAMA_8B, tp=8, fsdp=32, dp=2, global_batch=64, seq=2048)
    assert over_dcn.seconds("TPU v5e", torus={"fsdp": 1, "tp": 1, "dp": 1}).comm["dp"] > 0


def test_seconds_of_some_collectives_adds_their_share_of_the_axes_time():
    p = sizing.plan(LLAMA_70B, dp=8, tp=8, pp=4, global_batch=64, seq=4096, microbatches=8)
    s = p.seconds("H100")
    for kind in ("dp", "tp", "pp"):
        mine = [c for c in p.collectives if c.kind == kind]
        assert p.seconds_of("H100", mine) == pytest.approx(s.comm[kind])
    assert p.seconds_of("H100", list(p.collectives)) == pytest.approx(sum(s.comm.values()))
    assert p.seconds_of("H100", []) == 0
    other = sizing.plan(LLAMA_70B, dp=8, tp=8, pp=2, global_batch=64, seq=4096, microbatches=8)
    # Another plan's collectives, even equal in value to this one's, are not this plan's.
    twin = sizing.plan(LLAMA_70B, dp=8, tp=8, pp=4, global_batch=64, seq=4096, microbatches=8)
    assert twin.collectives == p.collectives
    for bad in (None, "dp", [1], iter(p.collectives), [other.collectives[-1]], [*twin.collectives]):
        with pytest.raises(ReaderError, match="Pass a list of this plan's collectives"):
            p.seconds_of("H100", bad)


def test_another_plans_collectives_are_named_so():
    a = sizing.plan(LLAMA_70B, dp=8, tp=8, pp=4, global_batch=64, seq=4096, microbatches=8)
    b = sizing.plan(LLAMA_70B, dp=8, tp=8, pp=4, global_batch=64, seq=4096, microbatches=8)
    with pytest.raises(ReaderError, match="not collectives of another plan"):
        a.seconds_of("H100", list(b.collectives))
