"""The four training strategies of Part III as compiled programs, for the strategy form.

Chapters 7 to 9 write data parallelism (DP), fully sharded data parallelism (FSDP), tensor
parallelism (TP, the column-then-row layout) and their 2D combination (DP x TP) out in their
cells, because there they are the lesson, and export those cells to ``book.lessons``. This
module takes the four steps from there, so the form runs the chapters' own code for any mesh
without a notebook. Each is one SGD step of ``book.models`` written with ``jax.shard_map``;
``analyze`` compiles one and reads its collectives and memory.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from book import cost, hlo, models, validate
from book.lessons import data_parallel, fsdp, tensor_parallel

STRATEGIES = ("DP", "FSDP", "TP", "DP x TP")
# The mesh axes each strategy uses, in mesh order.
AXES = {"DP": ("data",), "FSDP": ("data",), "TP": ("model",), "DP x TP": ("data", "model")}
_MEGATRON = tensor_parallel.megatron
PARAM_SPECS = {
    "DP": {name: P() for name in _MEGATRON},
    "FSDP": {name: P("data") for name in _MEGATRON},
    "TP": _MEGATRON,
    "DP x TP": _MEGATRON,
}
BATCH_SPECS = {"DP": P("data"), "FSDP": P("data"), "TP": P(), "DP x TP": P("data")}
SIZES = data_parallel.sizes  # the chapters' problem, the form's default
LEARNING_RATE = data_parallel.LEARNING_RATE
_BODIES = {
    "DP": data_parallel.dp_train_step,
    "FSDP": fsdp.fsdp_train_step,
    "TP": tensor_parallel.tp_step,
    "DP x TP": tensor_parallel.dp_tp_step,
}


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
