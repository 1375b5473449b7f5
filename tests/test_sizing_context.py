"""book.sizing.plan's cp (Ulysses) against chapter 13's step compiled on 8 mock CPU devices.

The programs are chapter 13's step with its attention replaced by Ulysses' (tests/
ulysses_attention.py); tests/compiled_context.py reads what they hold and send.
"""

import compiled_context
import numpy as np
import pytest

from book import cost, sizing
from book.lessons import transformer as T

# Small d_model and a long sequence: activations outweigh weights. vocab = d_model, as in
# chapter 13's Config: the plan's fourth array of the stream outside the layers is, in the
# compiled program, the targets' one-hot (vocab wide).
CFG = T.Config(vocab=32, d_model=32, n_heads=16, n_kv_heads=8, d_head=4, d_mlp=64, n_layers=2)
BATCH, SEQ = 4, 128


def data(cfg=CFG, batch=BATCH, seq=SEQ):
    rng = np.random.default_rng(0)
    return [rng.integers(0, cfg.vocab, (batch, seq)).astype(np.int32) for _ in range(2)]


@pytest.mark.parametrize(
    "mesh_shape, axes",
    [
        ((4,), ("context",)),
        ((2, 4), ("data", "context")),
        ((2, 2), ("context", "model")),
        ((2, 4), ("fsdp", "context")),
    ],
)
def test_the_plan_equals_the_compiled_ulysses_step(mesh_shape, axes):
    compiled_context.check_ulysses(CFG, mesh_shape, axes, *data())


def test_chapter_13s_block_gathers_over_context_where_it_names_no_sequence():
    compiled_context.check_drop_in_alone(CFG, 4, *data())


def test_cp_bytes_and_memory_follow_the_formulas():
    m = sizing.PRESETS["Llama 3 8B"]
    kw = dict(global_batch=16, seq=32768)
    one, cp = sizing.plan(m, dp=2, **kw), sizing.plan(m, dp=2, cp=4, **kw)
    for part in ("params", "grads", "optimizer"):  # weights replicated over cp
        assert cp.memory[part] == one.memory[part]
    assert cp.memory["activations"] == one.memory["activations"] // 4
    tokens = 16 // 2 * 32768  # a data-parallel group's
    fwd = cost.ulysses_bytes(tokens, m.heads, m.kv_heads, m.head_dim, 4, itemsize=2)
    a2a = sum(c.sent * c.count for c in cp.collectives if c.op == "all-to-all")
    assert a2a == pytest.approx(3 * m.layers * fwd)
    assert a2a == pytest.approx(
        m.layers * (cost.ulysses_bytes(tokens, m.heads, m.kv_heads, m.head_dim, 4, 2, True) + fwd)
    )
    grads = 4 * sizing.param_count(m)
    assert cp.comm["cp"] == pytest.approx(a2a + cost.all_reduce_bytes(grads, 4))
    assert cp.comm["dp"] == one.comm["dp"]
    none = sizing.plan(m, dp=2, cp=4, remat="none", **kw)
    assert sum(c.sent * c.count for c in none.collectives if c.op == "all-to-all") == (
        pytest.approx(2 * m.layers * fwd)
    )
    tp = sizing.plan(m, cp=4, tp=2, **kw)  # TP's stream and heads, both split
    assert tp.comm["tp"] == pytest.approx(sizing.plan(m, tp=2, **kw).comm["tp"] / 4)
    assert cp.seconds("H100").comm["cp"] > 0


@pytest.mark.parametrize(
    "kw",
    [dict(cp=3), dict(cp=8, tp=2), dict(cp=16), dict(cp=2, pp=2), dict(cp=2, dp=2, zero=1),
     dict(cp=2, tp=2, sequence_parallel=True), dict(cp=0)],
)  # fmt: skip
def test_cp_that_cannot_be_planned_is_refused_in_one_sentence(kw):
    with pytest.raises(sizing.SizingError) as e:
        sizing.plan(sizing.PRESETS["Llama 3 8B"], global_batch=8, seq=4096, **kw)
    assert str(e.value).count(". ") == 0


def test_a_sequence_that_does_not_split_over_cp_is_refused():
    m = sizing.Transformer(2, 64, 128, 8, 8, 64)
    with pytest.raises(sizing.SizingError, match="does not split evenly over cp=8"):
        sizing.plan(m, cp=8, global_batch=1, seq=100)
