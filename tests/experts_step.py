"""Chapter 21's dropless expert step (notebooks/21_newer_forms.ipynb, cells 4-9), generalized.

Copied from the chapter: ``moe`` (sort each device's tokens into blocks sized for the worst
case, ``all_to_all`` over "expert", ``ragged_dot_general``, ``all_to_all`` back), ``gather``
(FSDP: each weight ``pcast`` to varying over the axes that share it, then gathered over
"fsdp"), ``loss_fn`` (chapter 13's block with ``moe`` in place of its MLP) and
``sharded_step`` (``jax.shard_map`` over the mesh, ``pmean`` of the loss). Changes: the sizes
(experts, top_k, config, mesh shape and axes) are arguments (a ``Setup``), not globals; a mesh
may lack "data" or "fsdp" (then ``gather`` only casts); and each layer may be wrapped in
``jax.checkpoint`` with a policy (compiled_plans.POLICIES), which the chapter's step has not.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from book.lessons import transformer as ch13

# (blocks, rows, d) @ (experts, d, f): contract d; each block's rows (dimension 1)
# in groups, one per expert, the rhs's dimension 0. No batch dimensions.
GROUPED = jax.lax.RaggedDotDimensionNumbers((([2], [1]), ([], [])), [1], [0])
MOE = ("router", "w_in", "w_out")
ALL_AXES = ("data", "fsdp", "expert")
is_names = lambda n: type(n) is tuple  # noqa: E731 - a tree's leaves: names


@dataclasses.dataclass(frozen=True, eq=False)
class Setup:
    cfg: ch13.Config
    n_experts: int
    top_k: int
    mesh: object
    axes: tuple  # the mesh's axes, a subsequence of ALL_AXES
    rules: dict
    names: dict  # each parameter's logical names
    specs: dict


def make_setup(cfg, n_experts, top_k, mesh_shape, axes):
    """Chapter 21's mesh (here of any of its axes), rules, logical names and specs."""
    assert tuple(a for a in ALL_AXES if a in axes) == tuple(axes), axes
    devices = jax.devices()[: math.prod(mesh_shape)]
    mesh = jax.make_mesh(
        mesh_shape, axes, axis_types=(AxisType.Explicit,) * len(axes), devices=devices
    )
    rules = {"batch": tuple(axes), "experts": "expert"}
    if "fsdp" in axes:
        rules["embed"] = "fsdp"
    names = {**ch13.PARAM_AXES, "blocks": {**ch13.PARAM_AXES["blocks"]}}
    names["blocks"]["router"] = ("layers", "embed", None)
    names["blocks"]["w_in"] = ("layers", "experts", "embed", "mlp")
    names["blocks"]["w_out"] = ("layers", "experts", "mlp", "embed")
    specs = jax.tree.map(lambda n: ch13.logical_spec(n, rules), names, is_leaf=is_names)
    return Setup(cfg, n_experts, top_k, mesh, tuple(axes), rules, names, specs)


def init_params(setup, seed=21):
    """Chapter 13's parameters with its MLP replaced by a router and experts (chapter 21's)."""
    cfg, E = setup.cfg, setup.n_experts
    rng = np.random.default_rng(seed)
    params = ch13.init_params(cfg)
    blocks, (L, D, F) = params["blocks"], (cfg.n_layers, cfg.d_model, cfg.d_mlp)
    del blocks["w_in"], blocks["w_out"]  # the MLP gives way to experts
    blocks["router"] = rng.normal(0, D**-0.5, (L, D, E)).astype(np.float32)
    blocks["w_in"] = rng.normal(0, D**-0.5, (L, E, D, F)).astype(np.float32)
    blocks["w_out"] = rng.normal(0, F**-0.5, (L, E, F, D)).astype(np.float32)
    return params


def moe(x, router, w_in, w_out, n_experts, top_k, capacity=None, axis=None):
    # Tokens x (..., d) through their top_k experts, of which this device holds E / n.
    shape, d = x.shape, x.shape[-1]
    x = x.reshape(-1, d)
    t, n = len(x), 1 if axis is None else jax.lax.axis_size(axis)
    local = n_experts // n
    gate, choice = jax.lax.top_k(jax.nn.softmax(x @ router), top_k)
    gate = gate / gate.sum(-1, keepdims=True)

    expert = choice.T.reshape(-1)  # the k t assignments, first choices first
    hot = jax.nn.one_hot(expert, n_experts, dtype=jnp.int32)
    rank = (jnp.cumsum(hot, 0) * hot).sum(-1) - 1  # queue place (k t x E: teaching form)
    sizes = hot.sum(0)
    kept = sizes if capacity is None else jnp.minimum(sizes, capacity)
    worst = min(top_k, local) * t  # a token's top_k experts are distinct
    rows = worst if capacity is None else local * capacity  # per block
    start = jnp.cumsum(kept) - kept  # where each expert's rows begin
    dest = expert // local  # the device that holds the expert
    slot = start[expert] - start[dest * local] + rank  # its row in dest's block
    slot = jnp.where(rank < kept[expert], slot, rows)  # dropped: past the block

    def exchange(a):  # block j to device j; block i of the result from device i
        return a if axis is None else jax.lax.all_to_all(a, axis, 0, 0, tiled=True)

    send = jnp.zeros((n, rows, d), x.dtype)
    send = send.at[dest, slot].set(jnp.tile(x, (top_k, 1)), mode="drop")
    got, got_sizes = exchange(send), exchange(kept.reshape(n, local))

    # Each block that arrived holds its rows grouped by this device's experts.
    h = jax.nn.gelu(jax.lax.ragged_dot_general(got, w_in, got_sizes, GROUPED))
    back = exchange(jax.lax.ragged_dot_general(h, w_out, got_sizes, GROUPED))
    out = back.at[dest, slot].get(mode="fill", fill_value=0).reshape(top_k, t, d)
    y = jnp.einsum("kt,ktd->td", gate.T, out)
    return y.reshape(shape), top_k * t - kept.sum()  # and how many were dropped


def gather(setup, tree, names, axis):  # FSDP: weights whole along d_model ("embed")
    def whole(w, n):
        # Varying first over the axes that share the weight: the transpose of this cast,
        # a psum, then sums the gradient's fsdp shard instead of the gathered whole.
        spec = ch13.logical_spec(n, setup.rules)
        split = {a for part in spec if part for a in (part if type(part) is tuple else (part,))}
        shared = tuple(a for a in setup.axes if a not in split)
        w = jax.lax.pcast(w, shared, to="varying") if shared else w
        if "fsdp" not in setup.axes:
            return w
        return jax.lax.all_gather(w, "fsdp", axis=n.index("embed"), tiled=True)

    return tree if axis is None else jax.tree.map(whole, tree, names, is_leaf=None)


def loss_fn(setup, params, tokens, targets, capacity=None, axis=None, policy=None):
    cfg = setup.cfg

    def layer(x, p):  # one block: its weights gathered, attention, then experts
        p = gather(setup, p, {k: n[1:] for k, n in setup.names["blocks"].items()}, axis)
        x = x + ch13.attention(ch13.rms_norm(x, p["attn_norm"]), p, cfg, None)
        h = ch13.rms_norm(x, p["mlp_norm"])
        y, dropped = moe(h, *(p[k] for k in MOE), setup.n_experts, setup.top_k, capacity, axis)
        return x + y, dropped

    if policy is not None:
        layer = jax.checkpoint(layer, policy=policy)
    outer = {k: params[k] for k in ("embed", "final_norm", "unembed")}
    outer = gather(setup, outer, {k: setup.names[k] for k in outer}, axis)
    x, dropped = jax.lax.scan(layer, outer["embed"][tokens], params["blocks"])
    log_probs = jax.nn.log_softmax(ch13.rms_norm(x, outer["final_norm"]) @ outer["unembed"])
    loss = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1).mean()
    return loss, dropped.sum()


def sharded_loss(setup, capacity=None, policy=None):
    """The loss on the mesh: each device's part of the batch and weights (chapter 21)."""
    axes = setup.axes

    def part(params, tokens, targets):
        loss, dropped = loss_fn(setup, params, tokens, targets, capacity, "expert", policy)
        return jax.lax.pmean(loss, axes), jax.lax.psum(dropped, axes)

    return jax.shard_map(
        part, mesh=setup.mesh, in_specs=(setup.specs, P(axes), P(axes)), out_specs=(P(), P())
    )


def sharded_step(setup, capacity=None, policy=None):
    return jax.jit(jax.value_and_grad(sharded_loss(setup, capacity, policy), has_aux=True))


def reference_step(setup, capacity=None):
    def loss(params, tokens, targets):
        return loss_fn(setup, params, tokens, targets, capacity, None)

    return jax.jit(jax.value_and_grad(loss, has_aux=True))


def put(setup, params, tokens, targets):
    """The arguments on the mesh: parameters by their specs, the batch over every axis."""
    shardings = (jax.tree.map(lambda s: NamedSharding(setup.mesh, s), setup.specs),)
    shardings += (NamedSharding(setup.mesh, P(setup.axes)),) * 2
    return jax.device_put((params, tokens, targets), shardings)
