"""The four training strategies of Part III as compiled programs, for the strategy form.

Chapters 7 to 9 write data parallelism (DP), fully sharded data parallelism (FSDP), tensor
parallelism (TP, the column-then-row layout) and their 2D combination (DP x TP) out in their
cells, because there they are the lesson. The strategy form needs the same four steps for any
mesh without a notebook, so this module holds them, and chapter 9 checks that they compile to
the same communication as the chapter's own. Each is one SGD step of ``book.models`` written
with ``jax.shard_map``; ``analyze`` compiles one and reads its collectives and memory.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from book import cost, hlo, models, validate

STRATEGIES = ("DP", "FSDP", "TP", "DP x TP")
# The mesh axes each strategy uses, in mesh order.
AXES = {"DP": ("data",), "FSDP": ("data",), "TP": ("model",), "DP x TP": ("data", "model")}
_MEGATRON = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}
PARAM_SPECS = {
    "DP": {name: P() for name in _MEGATRON},
    "FSDP": {name: P("data") for name in _MEGATRON},
    "TP": _MEGATRON,
    "DP x TP": _MEGATRON,
}
BATCH_SPECS = {"DP": P("data"), "FSDP": P("data"), "TP": P(), "DP x TP": P("data")}
LEARNING_RATE = 0.1


def _dp_step(params, x, y):
    params_here = jax.lax.pcast(params, "data", to="varying")
    loss, grads = jax.value_and_grad(models.loss)(params_here, x, y)
    loss, grads = jax.lax.pmean(loss, "data"), jax.lax.pmean(grads, "data")
    return models.sgd(params, grads, LEARNING_RATE), loss


def _fsdp_step(shards, x, y):
    def loss_fn(shards):
        whole = {k: jax.lax.all_gather(s, "data", axis=0, tiled=True) for k, s in shards.items()}
        return models.loss(whole, x, y)

    loss, grads = jax.value_and_grad(loss_fn)(shards)
    grads = jax.tree.map(lambda g: g / jax.lax.axis_size("data"), grads)
    return models.sgd(shards, grads, LEARNING_RATE), jax.lax.pmean(loss, "data")


def _megatron_loss(params, x, y):
    """Column-parallel w1, row-parallel w2: one psum of the logits over ``model``."""
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    logits = jax.lax.psum(h @ params["w2"], "model") + params["b2"]
    return models.cross_entropy(logits, y)


def _tp_step(params, x, y):
    loss, grads = jax.value_and_grad(_megatron_loss)(params, x, y)
    return models.sgd(params, grads, LEARNING_RATE), loss


def _dp_tp_step(params, x, y):
    params_here = jax.lax.pcast(params, "data", to="varying")
    loss, grads = jax.value_and_grad(_megatron_loss)(params_here, x, y)
    loss, grads = jax.lax.pmean(loss, "data"), jax.lax.pmean(grads, "data")
    return models.sgd(params, grads, LEARNING_RATE), loss


_BODIES = {"DP": _dp_step, "FSDP": _fsdp_step, "TP": _tp_step, "DP x TP": _dp_tp_step}


def mesh(strategy: str, mesh_shape: tuple[int, ...]):
    """A mesh for ``strategy`` on the first ``prod(mesh_shape)`` devices, axes named for it."""
    devices = jax.devices()[: math.prod(mesh_shape)]
    names = AXES[strategy]
    return jax.make_mesh(
        mesh_shape, names, axis_types=(AxisType.Explicit,) * len(names), devices=devices
    )


def train_step(strategy: str, mesh):
    """The jitted SGD step of ``strategy`` on ``mesh``: ``(params, x, y) -> (params, loss)``."""
    specs = PARAM_SPECS[strategy]
    batch = BATCH_SPECS[strategy]
    return jax.jit(
        jax.shard_map(
            _BODIES[strategy],
            mesh=mesh,
            in_specs=(specs, batch, batch),
            out_specs=(specs, P()),
        )
    )


def abstract_inputs(strategy: str, mesh, sizes: models.Sizes):
    """Shapes, dtypes and shardings of a step's inputs, so it compiles without any data."""
    shapes = {
        "w1": (sizes.features, sizes.hidden),
        "b1": (sizes.hidden,),
        "w2": (sizes.hidden, sizes.classes),
        "b2": (sizes.classes,),
    }
    params = {
        name: jax.ShapeDtypeStruct(
            shape, "float32", sharding=NamedSharding(mesh, PARAM_SPECS[strategy][name])
        )
        for name, shape in shapes.items()
    }
    batch = NamedSharding(mesh, BATCH_SPECS[strategy])
    x = jax.ShapeDtypeStruct((sizes.batch, sizes.features), "float32", sharding=batch)
    y = jax.ShapeDtypeStruct((sizes.batch,), "int32", sharding=batch)
    return params, x, y


@dataclass(frozen=True)
class Analysis:
    """What one compiled step costs each device: its parameters, memory and collectives."""

    strategy: str
    mesh_shape: tuple[int, ...]
    sizes: models.Sizes
    param_shards: dict  # name -> (global shape, spec, shard shape, bytes per device)
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    collectives: tuple  # book.hlo rows of groups larger than one device
    sent_bytes: float  # the ring formula of book.cost summed over the collectives

    @property
    def param_bytes(self) -> int:
        """Parameter bytes one device holds."""
        return sum(entry[3] for entry in self.param_shards.values())


# Compile options for programs that are inspected and never run: the machine-code
# optimisations cost most of the time and, as chapter 8 checks on CPU, change neither the
# collectives nor the buffers.
INSPECT_ONLY = {"xla_backend_optimization_level": 0}


def analyze(strategy: str, mesh_shape: tuple[int, ...], sizes: models.Sizes) -> Analysis:
    """Compile one step of ``strategy`` (cached) and read what it costs each device.

    The choice goes through the strategy form's checks first (``book.forms.check_strategy``),
    so one that cannot work is one sentence. Collectives over groups of a single device move
    nothing and are left out.
    """
    from book import forms, specs

    shape = validate.sizes(mesh_shape, "The mesh shape", error=specs.SpecError)
    if not isinstance(sizes, models.Sizes):
        raise specs.SpecError(
            "sizes must be a book.models.Sizes(batch, features, hidden, classes), not "
            f"{validate.describe(sizes)}."
        )
    choice = forms.check_strategy(strategy, "x".join(map(str, shape)), *sizes)
    return _analyze(choice.strategy, choice.mesh_shape, choice.sizes)


@functools.lru_cache(maxsize=64)
def _analyze(strategy: str, mesh_shape: tuple[int, ...], sizes: models.Sizes) -> Analysis:
    m = mesh(strategy, mesh_shape)
    params, x, y = abstract_inputs(strategy, m, sizes)
    compiled = train_step(strategy, m).lower(params, x, y).compile(INSPECT_ONLY)
    shards = {}
    for name, p in params.items():
        shard = p.sharding.shard_shape(p.shape)
        shards[name] = (p.shape, PARAM_SPECS[strategy][name], shard, math.prod(shard) * 4)
    rows = tuple(r for r in hlo.collectives(compiled) if r.group_size > 1)
    memory = compiled.memory_analysis()
    return Analysis(
        strategy=strategy,
        mesh_shape=tuple(mesh_shape),
        sizes=sizes,
        param_shards=shards,
        argument_bytes=memory.argument_size_in_bytes,
        output_bytes=memory.output_size_in_bytes,
        temp_bytes=memory.temp_size_in_bytes,
        collectives=rows,
        sent_bytes=sum(cost.ring_bytes(r) for r in rows),
    )
