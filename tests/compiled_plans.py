"""Chapter 18's calculator against programs XLA compiled, byte by byte: the tests' checks.

Chapter 18 shows one layout's state and TP bytes beside its plan; tests/test_sizing.py runs these
on chapter 13's other layouts and on chapter 14's pipeline. ``check_layout`` and
``check_pipeline`` compile a program, read from it what each device holds and sends (shardings,
a compiled AdamW init, what the forward pass keeps for the backward pass, each collective by the
mesh axis its groups span, times its loop's trip count) and assert it equal to the plan where it
must be and within stated bounds where it cannot be. The plan is asked for the same step:
float32 throughout, and FSDP's gradients reduced as the program reduces them (the CPU compiler
writes a reduce-scatter as an all-reduce and a slice, twice the bytes).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from book import cost, hlo, sizing
from book.lessons import transformer
from book.lessons.pipeline import INNER_AXES, make_pipeline, pipeline_loss
from book.lessons.planning import (
    FAST,
    KIND,
    adamw_bytes,
    in_layers,
    layout_for,
    shard_bytes,
    small_model,
)
from book.lessons.transformer import (
    PARAM_AXES,
    SP_RULES,
    Layout,
    axes_of,
    init_params,
    loss_fn,
    make_step,
    param_shardings,
)

# The calculator's remat conventions as JAX policies for chapter 13's layers.
POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "none": None,
}


def sent_by_kind(compiled, mesh):
    """Bytes each device sends per step by kind of axis: in all, and in the loops.

    Each collective's ring bytes (book.cost), times its loop's trip count; the loops
    are the layers'. A collective over several axes, or pairs across them, counts as
    "between".
    """
    trips = hlo.loop_trips(compiled)
    step, loops = {}, {}
    for row in hlo.collectives(compiled):
        axes = moved_along(row, mesh) if row.op == "collective-permute" else None
        kind = KIND.get(axes or axes_of(row, mesh), "between")
        sent = cost.ring_bytes(row) * trips.get(row.computation, 1)
        step[kind] = step.get(kind, 0) + sent
        if row.computation in trips:
            loops[kind] = loops.get(kind, 0) + sent
    return step, loops


def moved_along(row, mesh):
    """The one mesh axis along which a collective-permute's pairs move, or None."""
    moved = {  # for each pair, the mesh dimensions its two positions differ in
        i
        for pair in row.groups
        for i, (a, b) in enumerate(np.unravel_index(pair, mesh.devices.shape))
        if a != b
    }
    return mesh.axis_names[moved.pop()] if len(moved) == 1 else None


def kept_bytes(cfg, layout, tokens, targets, policy):
    """Bytes per device the forward pass keeps for the backward pass (chapter 13)."""

    def kept(params, tokens, targets):
        _, backward = jax.vjp(lambda p: loss_fn(p, tokens, targets, cfg, layout, policy), params)
        given = {id(a) for a in jax.tree.leaves((params, tokens, targets))}
        return [r for r in jax.tree.leaves(backward) if id(r) not in given]

    shardings = param_shardings(layout, PARAM_AXES)
    data = layout.sharding(("batch", None))
    fn = jax.jit(kept, in_shardings=(shardings, data, data))
    compiled = fn.lower(init_params(cfg), tokens, targets).compile(FAST)
    kept_shapes = jax.eval_shape(kept, init_params(cfg), tokens, targets)
    return shard_bytes(compiled.output_shardings, kept_shapes)


def measure(cfg, layout, tokens, targets):
    """What the compiled programs hold and send, per device, for one layout.

    The step is compiled with full remat, the calculator's default, so that its
    communication includes what recomputing the forward pass sends.
    """
    params = init_params(cfg)
    step = make_step(cfg, layout, POLICIES["full"]).lower(params, tokens, targets)
    step = step.compile(FAST)
    sent, loops = sent_by_kind(step, layout.mesh)
    # How the compiler reduces FSDP's gradients (CPU: an all-reduce, then a slice).
    ops = {row.op for row in hlo.collectives(step)}
    reduce = "reduce-scatter" if "reduce-scatter" in ops else "all-reduce"
    return {
        "step": step,
        "gradient_reduce": reduce,
        "params": shard_bytes(step.input_shardings[0][0], params),
        "grads": shard_bytes(step.output_shardings[2], params),  # shaped alike
        "optimizer": adamw_bytes(params, param_shardings(layout, PARAM_AXES)),
        "activations": {
            remat: kept_bytes(cfg, layout, tokens, targets, p) for remat, p in POLICIES.items()
        },
        "comm": sent,
        "loops": loops,
    }


def planned(cfg, degrees, batch, seq, remat, gradient_reduce, microbatches=1):
    """The calculator's plan of chapter 13's step: float32, as that step computes."""
    return sizing.plan(
        small_model(cfg),
        **degrees,
        global_batch=batch,
        seq=seq,
        microbatches=microbatches,
        compute_dtype="float32",
        remat=remat,
        gradient_reduce=gradient_reduce,
    )


def layers_sent(cfg, plan, kind):
    """The bytes the compiled layers send over one kind of axis, by the calculator.

    The plan's, and for FSDP the layers' two norm scales, which for the recomputation
    the compiler gathers a third time.
    """
    sent = in_layers(plan, kind)
    if kind == "fsdp":
        norms = 2 * cfg.d_model * 4
        sent += cfg.n_layers * cost.all_gather_bytes(norms, plan.layout["fsdp"])
    return sent


def activation_slack(cfg, batch, seq, local_tokens, remat, tp=1):
    """What the activation estimate leaves out of the compiled residuals, at most.

    A few numbers per token (the tokens themselves, the norms' and the softmax's
    per-token statistics) and a norm scale or two; without remat also the causal mask,
    as booleans and as float32, which the compiler hoists out of the layers' loop and
    keeps whole, for the global batch, on every device, and one array of the MLP's
    hidden units per layer: jax 0.10 keeps six of them where jax 0.12 keeps the
    estimate's five.
    """
    slack = (16 * local_tokens + 2 * cfg.d_model) * 4
    if remat == "none":
        slack += batch * cfg.n_heads * seq * seq * (1 + 4)
        slack += cfg.n_layers * local_tokens * math.ceil(cfg.d_mlp / tp) * 4
    return slack


def check_layout(cfg, name, mesh_shape, tokens, targets):
    """Compile chapter 13's layout and plan it: equal where they must be, else bounded.

    Returns the degrees, what was measured, and the plans under each remat policy.
    """
    batch, seq = tokens.shape
    layout, degrees = layout_for(name, mesh_shape)
    got = measure(cfg, layout, tokens, targets)
    plans = {
        remat: planned(cfg, degrees, batch, seq, remat, got["gradient_reduce"])
        for remat in sizing.REMAT
    }
    local = batch // (degrees.get("dp", 1) * degrees.get("fsdp", 1)) * seq
    for part in ("params", "grads", "optimizer"):  # the state: byte for byte
        assert got[part] == plans["full"].memory[part], part
    for remat, plan in plans.items():  # activations: short by at most the slack
        want, kept = plan.memory["activations"], got["activations"][remat]
        slack = activation_slack(cfg, batch, seq, local, remat, degrees.get("tp", 1))
        assert want <= kept <= want + slack
    plan = plans["full"]
    for kind, n in degrees.items():
        loops, step, want = (
            got["loops"].get(kind, 0),
            got["comm"][kind],
            plan.comm[kind],
        )
        assert math.isclose(loops, layers_sent(cfg, plan, kind), rel_tol=1e-12), kind
        if kind == "dp":  # the gradients, and the loss averaged over the batch
            assert want <= step <= want + cost.all_reduce_bytes(2 * 4, n)
        if kind == "tp":  # and a few numbers per token for the split softmax, and
            # with FSDP jax 0.10 all-reduces the embedding's gradient (its FSDP shard)
            extra = 8 * cost.all_reduce_bytes(local * 4, n)
            if "fsdp" in degrees:
                shard = cfg.vocab * cfg.d_model // degrees["fsdp"] * 4
                extra += cost.all_reduce_bytes(shard, n)
            assert want <= step <= want + extra
        if kind == "fsdp":  # the ends: the compiler gathers less than every weight twice
            assert loops <= step <= want
    # Between axes: tokens and activations moved for the embedding lookup.
    assert got["comm"].get("between", 0) <= local * cfg.d_model * 4
    return degrees, got, plans


def check_sequence_parallel(cfg, tp, tokens, targets):
    """What TP with sequence parallelism keeps for the backward pass, under each remat policy:
    never less than the plan, and more by at most the slack (the layers' arrays of the stream
    split by sequence, the unembedding's input gathered whole)."""
    batch, seq = tokens.shape
    mesh = jax.make_mesh((tp,), ("model",), axis_types=(AxisType.Auto,), devices=jax.devices()[:tp])
    layout = Layout(mesh, SP_RULES)
    for remat, policy in POLICIES.items():
        kept = kept_bytes(cfg, layout, tokens, targets, policy)
        plan = sizing.plan(
            small_model(cfg), tp=tp, global_batch=batch, seq=seq, compute_dtype="float32",
            remat=remat, sequence_parallel=True,
        )  # fmt: skip
        want = plan.memory["activations"]
        slack = activation_slack(cfg, batch, seq, batch * seq, remat, tp)
        assert want <= kept <= want + slack, (remat, want, kept)


def pipeline_for(cfg, mesh_shape, axes, m, tokens, targets):
    """Chapter 14's step on a mesh of these axes, with full remat, and its arguments."""
    mesh = jax.make_mesh(mesh_shape, axes, axis_types=(AxisType.Explicit,) * len(axes))
    full = jax.checkpoint_policies.nothing_saveable  # full remat, the plan's default
    params = init_params(cfg)
    step, args = make_pipeline(cfg, params, mesh, tokens, targets, m, policy=full)
    degrees = {KIND[axis]: size for axis, size in zip(axes, mesh_shape, strict=True)}
    return step, args, mesh, degrees


def pipeline_kept(cfg, mesh, args, policy):
    """Bytes per device the pipeline keeps for its backward pass, less parameters."""
    specs = jax.tree.map(lambda a: a.sharding.spec, args)
    inner = tuple(axis for axis in INNER_AXES if axis in mesh.axis_names)

    def loss(params, tokens, targets):
        return pipeline_loss(params, tokens, targets, cfg, 1, inner, policy)[0]

    loss = jax.shard_map(loss, mesh=mesh, in_specs=specs, out_specs=P())

    def kept(params, tokens, targets):
        _, backward = jax.vjp(lambda p: loss(p, tokens, targets), params)
        return jax.tree.leaves(backward)

    compiled = jax.jit(kept).lower(*args).compile(FAST)
    shapes = jax.eval_shape(kept, *args)
    held = [  # each parameter's shape on one device, less dimensions of 1
        tuple(n for n in a.sharding.shard_shape(a.shape) if n > 1) for a in jax.tree.leaves(args[0])
    ]
    pairs = zip(shapes, compiled.output_shardings, strict=True)
    return sum(
        math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
        for x, s in pairs
        if tuple(n for n in s.shard_shape(x.shape) if n > 1) not in held
    )


def pipeline_slack(cfg, plan, m, p, local_tokens, batch, seq):
    """What the pipeline keeps beyond the estimate with full remat, at most.

    The estimate keeps m microbatches' layer activations; the scan keeps all m + p - 1
    steps', idle ones included (chapter 14). Outside the layers the estimate keeps four
    arrays of the stream and the logits for every token; with FSDP the program also
    keeps the final norm and unembedding it gathered, for the backward pass; beyond
    that, activation_slack.
    """
    tp, fsdp = plan.layout["tp"], plan.layout["fsdp"]
    ends = local_tokens * (4 * cfg.d_model + math.ceil(cfg.vocab / tp)) * 4
    idle = (plan.memory["activations"] - ends) * (p - 1) // m
    gathered = (cfg.d_model + cfg.d_model * math.ceil(cfg.vocab / tp)) * 4
    slack = activation_slack(cfg, batch, seq, local_tokens, "full")
    return idle + slack + (gathered if fsdp > 1 else 0)


def schedule_sent(plan, kind, m, p):
    """The calculator's bytes in the layers over one kind of axis, at every step.

    The plan counts m microbatches; chapter 14's program runs each layer at all
    m + p - 1 steps of its schedule, each reduction (and TP's all-reduces) once a step.
    Its forward gathers, with v = 1, depend on the stage's weights alone and run once,
    before the schedule's loop; the backward gathers again at every step.
    """
    steps, sent = m + p - 1, 0.0
    for c in plan.collectives:
        if c.kind == kind and c.in_layers:
            per_microbatch = c.sent * c.count / m
            if kind == "fsdp" and c.op == "all-gather":  # half forward, half backward
                sent += per_microbatch / 2 * (1 + steps)
            else:
                sent += per_microbatch * steps
    return sent


def pipeline_expected(plan, kind, m, local_tokens):
    """What chapter 14's program sends over one kind of axis in a step, by the plan.

    The layers at every step of the schedule (schedule_sent); the ends as the plan
    counts them, but FSDP's gathered once and reduced once for all the microbatches;
    over TP three numbers more per token (the split softmax's maximum and sum, and the
    target's logit); and the loss, summed over the stages and averaged over the batch.
    """
    p, n = plan.layout["pp"], plan.layout[kind]
    ends = plan.comm[kind] - in_layers(plan, kind)
    if kind == "fsdp":
        ends = sum(c.sent for c in plan.collectives if c.kind == kind and not c.in_layers)
    if kind == "tp":
        return (
            schedule_sent(plan, kind, m, p) + ends + 3 * cost.all_reduce_bytes(local_tokens * 4, n)
        )
    layers = schedule_sent(plan, kind, m, p) if kind == "fsdp" else in_layers(plan, kind)
    return layers + ends + cost.all_reduce_bytes(4, n)


def check_pipeline(cfg, mesh_shape, axes, m, tokens, targets):
    """Compile chapter 14's pipeline and plan it: equal, or within stated bounds."""
    batch, seq = tokens.shape
    step, args, mesh, degrees = pipeline_for(cfg, mesh_shape, axes, m, tokens, targets)
    compiled = step.lower(*args).compile(FAST)
    full = jax.checkpoint_policies.nothing_saveable  # full remat, the plan's default
    got = {
        "step": compiled,
        "params": shard_bytes(compiled.input_shardings[0][0], args[0]),
        "grads": shard_bytes(compiled.output_shardings[1], args[0]),
        "optimizer": adamw_bytes(args[0], compiled.input_shardings[0][0]),
        "activations": pipeline_kept(cfg, mesh, args, full),
    }
    got["comm"], got["loops"] = sent_by_kind(compiled, mesh)
    trips = hlo.loop_trips(compiled)
    got["permutes"] = sum(
        cost.ring_bytes(row) * trips.get(row.computation, 1)
        for row in hlo.collectives(compiled)
        if row.op == "collective-permute"
    )
    ops = {row.op for row in hlo.collectives(compiled)}
    reduce = "reduce-scatter" if "reduce-scatter" in ops else "all-reduce"
    plan = planned(cfg, degrees, batch, seq, "full", reduce, m)
    p = degrees["pp"]
    for part in ("params", "grads", "optimizer"):  # the state: byte for byte
        assert got[part] == plan.memory[part], part
    local = batch // (degrees.get("dp", 1) * degrees.get("fsdp", 1)) * seq
    want = plan.memory["activations"]  # and the idle steps, and the slack
    slack = pipeline_slack(cfg, plan, m, p, local, batch, seq)
    assert want <= got["activations"] <= want + slack
    # Between stages: a microbatch's activations and their gradients, at every step.
    permutes = sum(c.sent * c.count for c in plan.collectives if c.op == "collective-permute")
    assert math.isclose(got["permutes"], permutes, rel_tol=1e-12)
    assert set(got["comm"]) == set(degrees)  # each collective over one axis
    if "fsdp" in degrees:  # a layer's gathers: once forward, at every step backward
        layers = cfg.n_layers // p
        gathered = {}  # the layers' gathers over fsdp, bytes per trip, by trip count
        for row in hlo.collectives(compiled):
            if row.op == "all-gather" and row.computation in trips:
                n = trips[row.computation]
                gathered[n] = gathered.get(n, 0) + cost.ring_bytes(row)
        one = sum(  # one layer's gather, as the plan counts it
            c.sent
            for c in plan.collectives
            if c.kind == "fsdp" and c.op == "all-gather" and c.in_layers
        )
        assert gathered.keys() == {layers, layers * (m + p - 1)}
        assert all(math.isclose(b, one, rel_tol=1e-12) for b in gathered.values())
    for kind in degrees:
        if kind in ("fsdp", "tp"):  # the layers, at every step of the schedule
            layers = schedule_sent(plan, kind, m, p)
            assert math.isclose(got["loops"][kind], layers, rel_tol=1e-12), kind
        expected = pipeline_expected(plan, kind, m, local)
        assert math.isclose(got["comm"][kind], expected, rel_tol=1e-12), kind
    return degrees, got, plan


@jax.custom_vjp
def _fused_context(q, k, v):
    """Causal attention's context as a fused kernel computes it (q: b s k g h; k, v: b s k h)."""
    return _fused_forward(q, k, v)[0]


def _fused_forward(q, k, v):
    scores = jnp.einsum("bqkgh,bskh->bkgqs", q, k) * q.shape[-1] ** -0.5
    causal = jnp.tril(jnp.ones(scores.shape[-2:], bool))
    scores = jnp.where(causal, scores, -jnp.inf)
    lse = jax.nn.logsumexp(scores, axis=-1, keepdims=True)
    context = jnp.einsum("bkgqs,bskh->bqkgh", jnp.exp(scores - lse), v)
    return context, (q, k, v, context, lse)  # what the backward keeps: no scores


def _fused_backward(kept, d_context):
    q, k, v, context, lse = kept
    scale = q.shape[-1] ** -0.5
    scores = jnp.einsum("bqkgh,bskh->bkgqs", q, k) * scale  # computed again
    causal = jnp.tril(jnp.ones(scores.shape[-2:], bool))
    weights = jnp.where(causal, jnp.exp(scores - lse), 0.0)
    dv = jnp.einsum("bkgqs,bqkgh->bskh", weights, d_context)
    dw = jnp.einsum("bqkgh,bskh->bkgqs", d_context, v)
    row = jnp.einsum("bqkgh,bqkgh->bkgq", d_context, context)[..., None]
    ds = weights * (dw - row) * scale
    return jnp.einsum("bkgqs,bskh->bqkgh", ds, k), jnp.einsum("bkgqs,bqkgh->bskh", ds, q), dv


_fused_context.defvjp(_fused_forward, _fused_backward)


def fused_attention(x, p, cfg, layout):
    """Chapter 13's attention with its context from a fused kernel's forward and backward."""
    heads = ("batch", None, "heads", None, None)
    qkv = transformer.constrain(jnp.einsum("bsd,dkjh->bskjh", x, p["wqkv"]), heads, layout)
    group = cfg.n_heads // cfg.n_kv_heads
    q, k, v = qkv[:, :, :, :group], qkv[:, :, :, group], qkv[:, :, :, group + 1]
    context = transformer.constrain(_fused_context(q, k, v), heads, layout)
    return jnp.einsum("bqkgh,kghd->bqd", context, p["wo"])


def check_fused_attention(cfg, tp, tokens, targets, monkeypatch):
    """Without remat, a fused attention keeps what the plan with fused_attention=True counts:
    never less, more by at most the slack; its gradients are the materialized attention's."""
    batch, seq = tokens.shape
    mesh = jax.make_mesh((tp,), ("model",), axis_types=(AxisType.Auto,), devices=jax.devices()[:tp])
    layout = Layout(mesh, transformer.TP_RULES)
    params = init_params(cfg)

    def run_step():
        step = make_step(cfg, layout).lower(params, tokens, targets).compile(FAST)
        return step(params, tokens, targets)

    want = run_step()
    materialized = kept_bytes(cfg, layout, tokens, targets, None)
    monkeypatch.setattr(transformer, "attention", fused_attention)
    got = run_step()
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    for g, w in zip(jax.tree.leaves(got[2]), jax.tree.leaves(want[2]), strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=1e-6)
    kept = kept_bytes(cfg, layout, tokens, targets, None)
    plans = {
        fused: sizing.plan(
            small_model(cfg), tp=tp, global_batch=batch, seq=seq, compute_dtype="float32",
            remat="none", fused_attention=fused,
        ).memory["activations"]
        for fused in (False, True)
    }  # fmt: skip
    # The slack of full remat, and jax 0.10's sixth array of the MLP's hidden units.
    slack = activation_slack(cfg, batch, seq, batch * seq, "full", tp)
    slack += cfg.n_layers * batch * seq * math.ceil(cfg.d_mlp / tp) * 4
    assert plans[True] <= kept <= plans[True] + slack, (plans, kept)
    # What the fused kernel no longer keeps: the scores, weights and mask, as planned.
    assert materialized - kept >= plans[False] - plans[True]
