"""Ulysses context parallelism (book.sizing.plan's cp) against programs XLA compiled.

In the style of tests/compiled_plans.py: ``check_ulysses`` compiles chapter 13's step with
Ulysses attention over a mesh axis "context" (tests/ulysses_attention.py), reads what each
device holds and sends (collectives by the mesh axis their groups span, times their loop's
trip count; what the forward pass keeps for the backward pass) and asserts it equal to
sizing.plan(..., cp=...) where it must be, within stated bounds where it cannot be.
"""

import math

import jax
import numpy as np
import ulysses_attention as ulysses
from compiled_plans import POLICIES, activation_slack, layers_sent
from jax.sharding import AxisType

from book import cost, hlo, sizing
from book.lessons import transformer as T
from book.lessons.planning import FAST, KIND, adamw_bytes, in_layers, shard_bytes, small_model

CP_KIND = {**KIND, ulysses.AXIS: "cp"}


def cp_layout(mesh_shape, axes):
    """A mesh of these axes and the rules of chapter 13's layouts with the sequence on
    "context", and the degrees for plan."""
    devices = jax.devices()[: math.prod(mesh_shape)]
    mesh = jax.make_mesh(mesh_shape, axes, axis_types=(AxisType.Auto,) * len(axes), devices=devices)
    rules = dict(ulysses.CP_RULES)
    batch = tuple(a for a in ("data", "fsdp") if a in axes)
    if batch:
        rules["batch"] = batch if len(batch) > 1 else batch[0]
    if "fsdp" in axes:
        rules["embed"] = "fsdp"
    if "model" in axes:
        rules.update(T.TP_RULES)
    degrees = {CP_KIND[a]: n for a, n in zip(axes, mesh_shape, strict=True)}
    return T.Layout(mesh, rules), degrees


def sent_by_kind(compiled, mesh):
    """Bytes each device sends per step by kind of axis (cp for "context"), in all and in
    the layers' loops, and the all-to-alls' bytes apart; every collective over one axis."""
    trips = hlo.loop_trips(compiled)
    step, loops, a2a = {}, {}, 0.0
    for row in hlo.collectives(compiled):
        kind = CP_KIND.get(T.axes_of(row, mesh), "between")
        sent = cost.ring_bytes(row) * trips.get(row.computation, 1)
        step[kind] = step.get(kind, 0) + sent
        if row.computation in trips:
            loops[kind] = loops.get(kind, 0) + sent
        if row.op == "all-to-all":
            assert kind == "cp" and row.computation in trips, row
            a2a += sent
    return step, loops, a2a


def kept_bytes(cfg, layout, tokens, targets, policy):
    """compiled_plans.kept_bytes with the loss looked up when called (ulysses' patched one)."""

    def kept(params, tokens, targets):
        _, backward = jax.vjp(lambda p: T.loss_fn(p, tokens, targets, cfg, layout, policy), params)
        given = {id(a) for a in jax.tree.leaves((params, tokens, targets))}
        return [r for r in jax.tree.leaves(backward) if id(r) not in given]

    shardings = T.param_shardings(layout, T.PARAM_AXES)
    data = layout.sharding(("batch", None))
    fn = jax.jit(kept, in_shardings=(shardings, data, data))
    compiled = fn.lower(T.init_params(cfg), tokens, targets).compile(FAST)
    shapes = jax.eval_shape(kept, T.init_params(cfg), tokens, targets)
    return shard_bytes(compiled.output_shardings, shapes)


def one_device(cfg, params, tokens, targets):
    """Chapter 13's step on one device, unpatched: the reference loss and gradients."""
    return T.make_step(cfg)(params, tokens, targets)


def cp_planned(cfg, degrees, batch, seq, remat, gradient_reduce="all-reduce"):
    return sizing.plan(
        small_model(cfg), **degrees, global_batch=batch, seq=seq, compute_dtype="float32",
        remat=remat, gradient_reduce=gradient_reduce,
    )  # fmt: skip


def planned_a2a(plan):
    return sum(c.sent * c.count for c in plan.collectives if c.op == "all-to-all")


def check_ulysses(cfg, mesh_shape, axes, tokens, targets, rtol=1e-5):
    """Compile chapter 13's step with Ulysses over "context" and plan it with cp.

    Asserts: loss and gradients equal the one-device step's; the state byte for byte; the
    all-to-alls' bytes equal to the plan's and to book.cost.ulysses_bytes under each remat
    policy (3 forward passes' worth per layer under full and minimal remat, 2 without); the
    layers' all-reduces over cp, dp, tp and fsdp equal to the plan's; the ends' within
    stated bounds; no collective over several axes, and no all-gather over "context";
    the kept activations the plan's, more by at most compiled_plans' slack for full remat
    (a few numbers per token) and, without remat, the causal mask (bool and float32) of the
    device's sequences and heads, which the compiler keeps.
    """
    batch, seq = tokens.shape
    layout, degrees = cp_layout(mesh_shape, axes)
    cp, tp = degrees["cp"], degrees.get("tp", 1)
    group = batch // (degrees.get("dp", 1) * degrees.get("fsdp", 1)) * seq  # a DP group's
    local = group // cp  # one device's tokens
    params = T.init_params(cfg)
    want = one_device(cfg, params, tokens, targets)
    got = {"a2a": {}, "activations": {}}
    with ulysses.patched():
        for remat, policy in POLICIES.items():
            step = T.make_step(cfg, layout, policy).lower(params, tokens, targets).compile(FAST)
            sent, loops, got["a2a"][remat] = sent_by_kind(step, layout.mesh)
            if remat == "full":
                got.update(step=step, comm=sent, loops=loops)
                out = step(params, tokens, targets)
            got["activations"][remat] = kept_bytes(cfg, layout, tokens, targets, policy)
    np.testing.assert_allclose(out[1], want[1], rtol=rtol)
    for g, w in zip(jax.tree.leaves(out[2]), jax.tree.leaves(want[2]), strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * np.abs(w).max())
    step = got["step"]
    got["params"] = shard_bytes(step.input_shardings[0][0], params)
    got["grads"] = shard_bytes(step.output_shardings[2], params)
    got["optimizer"] = adamw_bytes(params, T.param_shardings(layout, T.PARAM_AXES))
    ops = {row.op for row in hlo.collectives(step)}
    reduce = "reduce-scatter" if "reduce-scatter" in ops else "all-reduce"
    plans = {r: cp_planned(cfg, degrees, batch, seq, r, reduce) for r in sizing.REMAT}
    plan = plans["full"]

    for part in ("params", "grads", "optimizer"):  # the state: byte for byte
        assert got[part] == plan.memory[part], part
    for remat, p in plans.items():
        kept, planned_kept = got["activations"][remat], p.memory["activations"]
        slack = activation_slack(cfg, batch, seq, local, "full", tp)
        if remat == "none":  # the causal mask, bool and float32, for the device's heads
            slack += group // seq * cfg.n_heads // (tp * cp) * seq * seq * (1 + 4)
        assert planned_kept <= kept <= planned_kept + slack, (remat, planned_kept, kept)
        # The all-to-alls: the plan's, and ulysses_bytes' forward passes per layer.
        passes = 2 if remat == "none" else 3
        one = cost.ulysses_bytes(group, cfg.n_heads // tp, cfg.n_kv_heads // tp, cfg.d_head, cp)
        assert math.isclose(got["a2a"][remat], planned_a2a(p), rel_tol=1e-12), remat
        assert math.isclose(got["a2a"][remat], passes * cfg.n_layers * one, rel_tol=1e-12)
    assert set(got["comm"]) <= set(degrees), got["comm"]  # each collective over one axis
    assert not any(
        row.op == "all-gather" and CP_KIND.get(T.axes_of(row, layout.mesh)) == "cp"
        for row in hlo.collectives(step)
    )
    # CP: in the layers, the all-to-alls and every layer's gradients (with FSDP the two
    # norms' whole: XLA reduces them over "context" before it splits them over fsdp).
    fsdp = degrees.get("fsdp", 1)
    norms = 2 * (cfg.d_model - cfg.d_model // fsdp) * 4
    layers_cp = in_layers(plan, "cp") + cfg.n_layers * cost.all_reduce_bytes(norms, cp)
    assert math.isclose(got["loops"]["cp"], layers_cp, rel_tol=1e-12)
    # The ends: their gradients and the loss (with FSDP the embedding and final norm whole).
    ends_cp = plan.comm["cp"] - in_layers(plan, "cp")
    whole = (cfg.vocab * cfg.d_model + cfg.d_model) * (fsdp - 1) // fsdp * 4
    ends_cp += cost.all_reduce_bytes(whole + 4, cp) if fsdp > 1 else 0
    exact = cost.all_reduce_bytes(4, cp)  # the loss, in the same all-reduce
    assert math.isclose(
        got["comm"]["cp"] - got["loops"]["cp"], ends_cp + exact * (fsdp == 1), rel_tol=1e-12
    )
    for kind, n in degrees.items():
        if kind == "cp":
            continue
        loops, sent, want_kind = got["loops"].get(kind, 0), got["comm"][kind], plan.comm[kind]
        assert math.isclose(loops, layers_sent(cfg, plan, kind), rel_tol=1e-12), kind
        if kind == "dp":  # the gradients, and the loss
            assert want_kind <= sent <= want_kind + cost.all_reduce_bytes(2 * 4, n)
        if kind == "tp":  # and a few numbers per token for the split softmax
            assert want_kind <= sent <= want_kind + 8 * cost.all_reduce_bytes(local * 4, n)
        if kind == "fsdp":  # the ends: less than every weight twice
            assert loops <= sent <= want_kind
    return degrees, got, plans


def check_drop_in_alone(cfg, cp, tokens, targets):
    """Chapter 13's block and forward with only attention replaced: the all-to-alls as
    planned, and the all-gathers over "context" that the block's and the logits' constraints
    (the sequence None) make XLA add: per layer the MLP's hidden units (forward and
    recomputation) and the stream's gradient (backward), and the final stream once."""
    batch, seq = tokens.shape
    layout, degrees = cp_layout((cp,), (ulysses.AXIS,))
    params = T.init_params(cfg)
    with ulysses.patched(whole=False):
        step = T.make_step(cfg, layout, POLICIES["full"]).lower(params, tokens, targets)
        step = step.compile(FAST)
    trips = hlo.loop_trips(step)
    gathered = {True: 0.0, False: 0.0}
    for row in hlo.collectives(step):
        if row.op == "all-gather":
            gathered[row.computation in trips] += cost.ring_bytes(row) * trips.get(
                row.computation, 1
            )
    stream, hidden = batch * seq * cfg.d_model * 4, batch * seq * cfg.d_mlp * 4
    per_layer = cost.all_gather_bytes(2 * hidden + stream, cp)
    assert math.isclose(gathered[True], cfg.n_layers * per_layer, rel_tol=1e-12), gathered
    assert math.isclose(gathered[False], cost.all_gather_bytes(stream, cp), rel_tol=1e-12)
    _, _, a2a = sent_by_kind(step, layout.mesh)
    plan = cp_planned(cfg, degrees, batch, seq, "full")
    assert math.isclose(a2a, planned_a2a(plan), rel_tol=1e-12)
    return gathered
