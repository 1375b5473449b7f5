"""Chapter 13's "Involuntary full rematerialization": where it comes from, and a way around it.

The chapter prints the warning its FSDP x TP step logs and says how to avoid it; compiling the
remedy there would add a compile to a chapter already over its time budget, so it is here.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import book.hlo
from book.lessons import transformer as lesson

FAST = {"xla_backend_optimization_level": 0}  # as the chapter compiles
CFG = lesson.Config()
BATCH, SEQ = 8, 16  # the chapter's sizes on mock CPU devices
MESHES = {  # the chapter's meshes for the two layouts that split both the table and the batch
    "FSDP x TP": ((4, 2), ("fsdp", "model")),
    "DP x FSDP x TP": ((2, 2, 2), ("data", "fsdp", "model")),
}
PLAIN_FORWARD = lesson.forward


def layout(name):
    shape, axes = MESHES[name]
    mesh = jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(shape))
    return lesson.Layout(mesh, lesson.RULES[name])


def batch():
    tokens = np.random.default_rng(0).integers(0, CFG.vocab, (BATCH, SEQ + 1), np.int32)
    return tokens[:, :-1], tokens[:, 1:]


def compiled_with_warnings(jitted, *args):
    """The program compiled as the chapter compiles it, and what XLA logged meanwhile."""
    with book.hlo.compiler_messages() as log:
        compiled = jitted.lower(*args).compile(FAST)
    return compiled, log.lines


def gathered_table_forward(params, tokens, cfg, layout=None, policy=None):
    """The chapter's forward, its table gathered over fsdp first, as FSDP gathers weights."""
    table = lesson.constrain(params["embed"], ("vocab", None), layout)
    return PLAIN_FORWARD({**params, "embed": table}, tokens, cfg, layout, policy)


@pytest.mark.skipif(jax.__version_info__ < (0, 12), reason="jax 0.10 warns for another layout")
def test_the_warning_comes_from_the_gradient_of_the_embedding_lookup():
    fsdp_tp = layout("FSDP x TP")
    table = lesson.param_shardings(fsdp_tp, lesson.PARAM_AXES)["embed"]
    ids = fsdp_tp.sharding(("batch", None))

    def lookup(embed, tokens):
        return lesson.constrain(embed[tokens], lesson.STREAM, fsdp_tp)

    def square_sum(embed, tokens):
        return jnp.sum(lookup(embed, tokens) ** 2)

    embed, tokens = lesson.init_params(CFG)["embed"], batch()[0]
    _, forward = compiled_with_warnings(jax.jit(lookup, in_shardings=(table, ids)), embed, tokens)
    gradient = jax.jit(jax.grad(square_sum), in_shardings=(table, ids), out_shardings=table)
    _, backward = compiled_with_warnings(gradient, embed, tokens)
    assert forward == [] and len(backward) == 1
    (line,) = backward
    assert "Involuntary full rematerialization" in line
    assert "from sharding {mesh['fsdp'=4,'model'=2], [{'fsdp'}, {}, {}]} to " in line
    assert "to {devices=[1,1,4,2]<=[8] last_tile_dim_replicate} efficiently" in line
    assert f"f32[{BATCH // 4},{SEQ},{CFG.d_model}]" in line


@pytest.mark.parametrize("name", MESHES)
def test_gathering_the_table_before_the_lookup_removes_the_warning(name, monkeypatch):
    params, (tokens, targets) = lesson.init_params(CFG), batch()
    _, ref_loss, ref_grads = lesson.make_step(CFG)(params, tokens, targets)
    plain = lesson.make_step(CFG, layout(name))
    _, plain_warnings = compiled_with_warnings(plain, params, tokens, targets)
    warns = "FSDP x TP" if jax.__version_info__ >= (0, 12) else "DP x FSDP x TP"
    assert bool(plain_warnings) == (name == warns)
    monkeypatch.setattr(lesson, "forward", gathered_table_forward)  # loss_fn calls it
    step = lesson.make_step(CFG, layout(name))
    compiled, warnings = compiled_with_warnings(step, params, tokens, targets)
    assert warnings == []
    _, loss, grads = compiled(params, tokens, targets)
    chex.assert_trees_all_close(loss, ref_loss, rtol=1e-5)
    chex.assert_trees_all_close(grads, ref_grads, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad_id", [CFG.vocab, 10**6, -1])
def test_an_id_outside_the_vocabulary_poisons_its_row_only(bad_id):
    params = lesson.init_params(CFG)
    tokens = np.random.default_rng(0).integers(0, CFG.vocab, (BATCH, SEQ), np.int32)
    tokens[3, 5] = bad_id  # indexing would have read a clamped or wrapped row, quietly
    logits = jax.jit(lambda p, t: lesson.forward(p, t, CFG, layout("FSDP x TP")))(params, tokens)
    poisoned = np.isnan(np.asarray(logits)).any(axis=(1, 2))
    assert poisoned.tolist() == [row == 3 for row in range(BATCH)]  # NaN, not a quiet row


@pytest.mark.parametrize("bad_target", [CFG.vocab, -1])
def test_a_target_outside_the_vocabulary_makes_the_loss_nan(bad_target):
    params = lesson.init_params(CFG)
    tokens = np.random.default_rng(0).integers(0, CFG.vocab, (BATCH, SEQ), np.int32)
    targets = np.roll(tokens, -1, axis=1)
    assert np.isfinite(
        float(jax.jit(lesson.loss_fn, static_argnums=3)(params, tokens, targets, CFG))
    )
    targets[2, 3] = bad_target  # one_hot of it is all zeros: it would score as certain
    assert np.isnan(float(jax.jit(lesson.loss_fn, static_argnums=3)(params, tokens, targets, CFG)))


def test_a_fractional_target_makes_the_loss_nan_and_a_misshapen_one_is_refused():
    params = lesson.init_params(CFG)
    tokens = np.random.default_rng(0).integers(0, CFG.vocab, (BATCH, SEQ), np.int32)
    targets = np.roll(tokens, -1, axis=1).astype(np.float32)
    targets[1, 2] += 0.5  # one_hot of 3.5 is all zeros: it would score as certain
    assert np.isnan(float(jax.jit(lesson.loss_fn, static_argnums=3)(params, tokens, targets, CFG)))
    with pytest.raises(ValueError, match="must match tokens"):  # (B, 1) would broadcast
        lesson.loss_fn(params, tokens, targets[:, :1], CFG)
