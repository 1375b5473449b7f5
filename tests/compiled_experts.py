"""Expert parallelism (book.sizing.plan's ep) against chapter 21's step, compiled.

In the style of tests/compiled_context.py: ``check_experts`` compiles chapter 21's dropless
expert step (tests/experts_step.py, the chapter's cells with each layer in
``jax.checkpoint``) on a ``data x fsdp x expert`` mesh (any of those axes), reads what each
device holds and sends (collectives by the mesh axes their groups span, times their loop's
trip count; what the forward pass keeps for the backward pass) and asserts it equal to
sizing.plan(..., ep=...) where it must be and within stated bounds where it cannot be.
"""

import math

import experts_step as M
import jax
import numpy as np
from compiled_plans import POLICIES, activation_slack

from book import cost, hlo, sizing
from book.lessons import transformer as T
from book.lessons.planning import FAST, adamw_bytes, shard_bytes

EP_KIND = {"data": "dp", "fsdp": "fsdp", "expert": "ep"}


def moe_model(cfg, n_experts, top_k):
    """Chapter 13's Config with chapter 21's experts as book.sizing's Transformer."""
    return sizing.Transformer(
        cfg.n_layers, cfg.d_model, cfg.d_mlp, cfg.n_heads, cfg.n_kv_heads, cfg.vocab,
        head_dim=cfg.d_head, gated=False, experts=n_experts, top_k=top_k,
    )  # fmt: skip


def by_axes(compiled, mesh):
    """Bytes each device sends per step, by (op, mesh axes, in the layers' loops or not)."""
    trips = hlo.loop_trips(compiled)
    sent = {}
    for row in hlo.collectives(compiled):
        key = (row.op, T.axes_of(row, mesh), row.computation in trips)
        sent[key] = sent.get(key, 0) + cost.ring_bytes(row) * trips.get(row.computation, 1)
    return sent


def kept_bytes(setup, args, policy):
    """Bytes per device the forward pass keeps for the backward pass, less parameters.

    The shard_map's residuals, as the jitted vjp's outputs; those shaped as a parameter's
    shard on one device (the weights cast to varying, which alias the parameters in a step)
    are left out, as tests/compiled_plans.pipeline_kept does. Weights FSDP gathered stay in.
    """
    loss = M.sharded_loss(setup, policy=policy)

    def kept(params, tokens, targets):
        _, backward = jax.vjp(lambda p: loss(p, tokens, targets)[0], params)
        given = {id(a) for a in jax.tree.leaves((params, tokens, targets))}
        return [r for r in jax.tree.leaves(backward) if id(r) not in given]

    compiled = jax.jit(kept).lower(*args).compile(FAST)
    shapes = jax.eval_shape(kept, *args)
    held = {tuple(a.sharding.shard_shape(a.shape)) for a in jax.tree.leaves(args[0])}
    return sum(
        math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
        for x, s in zip(shapes, compiled.output_shardings, strict=True)
        if tuple(s.shard_shape(x.shape)) not in held
    )


def ep_planned(model, degrees, batch, seq, remat, gradient_reduce):
    return sizing.plan(
        model, **degrees, global_batch=batch, seq=seq, compute_dtype="float32", remat=remat,
        gradient_reduce=gradient_reduce,
    )  # fmt: skip


def planned_sum(plan, op, n=None, in_layers=None, kind=None):
    return sum(
        c.sent * c.count
        for c in plan.collectives
        if c.op == op
        and (n is None or c.n == n)
        and (in_layers is None or c.in_layers == in_layers)
        and (kind is None or c.kind == kind)
    )


def moe_slack(cfg, setup, t, remat):
    """What the plan's MoE estimate leaves out without remat, per device: per layer the
    scatter's drop mask (top_k t d booleans) and top_k t 28 + 16 t + 4 E bytes of indices,
    gates, statistics and counts; once, outside the layers' loop, a float32 array of
    top_k t x d_model that depends on no layer (hoisted by JAX's scan, not identified
    further); nothing with remat."""
    if remat != "none":
        return 0
    k, E = setup.top_k, setup.n_experts
    return cfg.n_layers * (k * t * (cfg.d_model + 28) + 16 * t + 4 * E) + k * t * cfg.d_model * 4


def check_experts(cfg, n_experts, top_k, mesh_shape, axes, tokens, targets, rtol=1e-5):
    """Compile chapter 21's step on this mesh under each remat policy and plan it with ep.

    Asserts: loss and gradients (full remat) equal the one-device step's; params, grads and
    AdamW's state byte for byte; the all-to-alls (every one over "expert", in the layers'
    loops) equal to the plan's and to layers x (passes - 1 forwards + a backward) of
    moe_all_to_all_bytes, under every remat policy; the all-reduces over "data" (experts'
    gradients), over "data x expert" (the other gradients, layers and ends) equal to the
    plan's, and over every axis the loss and the drops, two scalars; FSDP's reduce-scatters
    equal to the plan's, its gathers in the layers the plan's under full and minimal remat
    and half of them without (see below); the kept activations within the stated bounds.
    """
    batch, seq = tokens.shape
    setup = M.make_setup(cfg, n_experts, top_k, mesh_shape, axes)
    model = moe_model(cfg, n_experts, top_k)
    degrees = {EP_KIND[a]: n for a, n in zip(axes, mesh_shape, strict=True)}
    dp, fsdp, ep = (degrees.get(k, 1) for k in ("dp", "fsdp", "ep"))
    t = batch * seq // math.prod(mesh_shape)  # tokens per device
    params = M.init_params(setup)
    args = M.put(setup, params, tokens, targets)
    got = {"sent": {}, "activations": {}}
    for remat, policy in POLICIES.items():
        step = M.sharded_step(setup, policy=policy).lower(*args).compile(FAST)
        got["sent"][remat] = by_axes(step, setup.mesh)
        got["activations"][remat] = kept_bytes(setup, args, policy)
        if remat == "full":
            (loss, dropped), grads = step(*args)
            got["step"] = step
    (want_loss, _), want_grads = (
        M.reference_step(setup)
        .lower(params, tokens, targets)
        .compile(FAST)(params, tokens, targets)
    )
    np.testing.assert_allclose(loss, want_loss, rtol=rtol)
    assert int(dropped) == 0
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * np.abs(w).max())
    step = got["step"]
    got["params"] = shard_bytes(step.input_shardings[0][0], params)
    got["grads"] = shard_bytes(step.output_shardings[1], params)
    got["optimizer"] = adamw_bytes(params, step.input_shardings[0][0])
    ops = {key[0] for key in got["sent"]["full"]}
    reduce = "reduce-scatter" if "reduce-scatter" in ops else "all-reduce"
    plans = {r: ep_planned(model, degrees, batch, seq, r, reduce) for r in POLICIES}

    for part in ("params", "grads", "optimizer"):  # the state: byte for byte
        assert got[part] == plans["full"].memory[part], part
    layer = sizing.moe_all_to_all_bytes(
        t, top_k=top_k, d_model=cfg.d_model, experts=n_experts, expert_parallel=ep,
        dtype="float32",
    )  # fmt: skip
    everything = " x ".join(axes)
    shared = " x ".join(a for a in axes if a != "fsdp")  # "data x expert", or "expert"
    scalars = 2 * cost.all_reduce_bytes(4, math.prod(mesh_shape))  # the loss and the drops
    ends_all = 0
    for remat, plan in plans.items():
        sent = got["sent"][remat]
        a2a = {k: v for k, v in sent.items() if k[0] == "all-to-all"}
        assert set(a2a) == {("all-to-all", "expert", True)}, a2a  # each in the layers
        passes = 2 if remat == "none" else 3
        per_layer = (passes - 1) * layer["forward"] + layer["backward"]
        assert math.isclose(a2a["all-to-all", "expert", True], cfg.n_layers * per_layer)
        assert math.isclose(a2a["all-to-all", "expert", True], planned_sum(plan, "all-to-all"))
        # All-reduces: the experts' gradients over data in the layers; the rest over
        # data x expert (one all-reduce, not one per axis), in the layers and at the ends.
        reduced = {k: v for k, v in sent.items() if k[0] == "all-reduce"}
        want = {}
        if dp > 1:
            want["all-reduce", "data", True] = planned_sum(plan, "all-reduce", dp, True, "dp")
        want["all-reduce", shared, True] = planned_sum(plan, "all-reduce", dp * ep, True)
        want["all-reduce", shared, False] = planned_sum(plan, "all-reduce", dp * ep, False)
        if everything != shared:  # the loss and the drops over every axis
            want["all-reduce", everything, False] = scalars
        else:  # one all-reduce with the ends' gradients
            want["all-reduce", shared, False] += scalars
        assert reduced.keys() == want.keys(), (reduced, want)
        for key, value in want.items():
            assert math.isclose(reduced[key], value, rel_tol=1e-12), (remat, key, value)
        if fsdp > 1:  # reduce-scatters as planned; gathers: see the docstring
            scattered = planned_sum(plan, "reduce-scatter", fsdp, True)
            assert math.isclose(sent["reduce-scatter", "fsdp", True], scattered, rel_tol=1e-12)
            ends = planned_sum(plan, "reduce-scatter", fsdp, False)
            assert math.isclose(sent["reduce-scatter", "fsdp", False], ends, rel_tol=1e-12)
            gathers = planned_sum(plan, "all-gather", fsdp, True)
            times = 1 / 2 if remat == "none" else 1  # without remat, kept, not gathered again
            assert math.isclose(sent["all-gather", "fsdp", True], gathers * times, rel_tol=1e-12)
            ends = planned_sum(plan, "all-gather", fsdp, False)  # the ends' once, kept
            assert math.isclose(sent["all-gather", "fsdp", False], ends / 2, rel_tol=1e-12)
            ends_all = ends / 2
        kinds = {EP_KIND.get(k[1], k[1]) for k in sent}
        assert kinds <= set(EP_KIND.values()) | {shared, everything}, kinds
    # Activations: the plan's, less the targets' one-hot (vocab numbers per token) that its
    # chapter-13 convention counts and this loss (take_along_axis) never makes; with FSDP,
    # plus the final norm and unembedding gathered for the loss's backward and, without remat,
    # every layer's gathered weights (what the compiler keeps in place of gathering again);
    # more by at most compiled_plans' slack, the MoE's (moe_slack) and, without remat, the
    # causal mask (bool and float32) of the device's sequences.
    layer_whole = sum(
        sizing._held(*a, {"ep": ep}) for n, a in sizing._arrays(model).items()
        if n.startswith("layer.")
    ) * 4  # fmt: skip
    got["bounds"] = {}
    for remat, plan in plans.items():
        low = plan.memory["activations"] - t * cfg.vocab * 4
        if fsdp > 1:
            low += (cfg.d_model + cfg.d_model * cfg.vocab) * 4
            if remat == "none":
                low += cfg.n_layers * layer_whole
        slack = activation_slack(cfg, batch, seq, t, "full") + moe_slack(cfg, setup, t, remat)
        if remat == "none":
            slack += t // seq * cfg.n_heads * seq * seq * (1 + 4)
        kept = got["activations"][remat]
        got["bounds"][remat] = (low, kept, low + slack)
        assert low <= kept <= low + slack, (remat, low, kept, low + slack)
    got["ends_gathered"] = ends_all
    return degrees, got, plans
