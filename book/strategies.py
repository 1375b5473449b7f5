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

from book import cost, hlo, models, specs, validate
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


@validate.impostors_refused
def mesh(strategy: str, mesh_shape: tuple[int, ...]):
    """A mesh for ``strategy`` on the first ``prod(mesh_shape)`` devices, axes named for it."""
    strategy, mesh_shape = _strategy_shape(strategy, mesh_shape)
    devices = jax.devices()[: math.prod(mesh_shape)]
    names = AXES[strategy]
    return jax.make_mesh(
        mesh_shape, names, axis_types=(AxisType.Explicit,) * len(names), devices=devices
    )


@validate.impostors_refused
def train_step(strategy: str, mesh):
    """The jitted SGD step of ``strategy`` on ``mesh``: ``(params, x, y) -> (params, loss)``."""
    strategy = _on_mesh(strategy, mesh)
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


@validate.impostors_refused
def abstract_inputs(strategy: str, mesh, sizes: models.Sizes):
    """Shapes, dtypes and shardings of a step's inputs, so it compiles without any data."""
    strategy = _on_mesh(strategy, mesh)
    sizes = check(strategy, tuple(mesh.devices.shape), sizes).sizes
    shapes = models.param_shapes(sizes)
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


MAX_MODEL_SIZE = 65536  # larger sizes take longer to compile than a form should wait


@dataclass(frozen=True)
class Choice:
    """One strategy step that can be compiled: a strategy, its mesh and the model's sizes."""

    strategy: str
    mesh_shape: tuple[int, ...]
    sizes: models.Sizes


def _size(value, name: str) -> int:
    return validate.whole(
        value,
        f"The {name} size",
        high=MAX_MODEL_SIZE,
        text=True,
        example=getattr(SIZES, name),
        too_large="more than a form can compile in reasonable time",
        error=specs.SpecError,
    )


def _strategy_shape(strategy, mesh_shape) -> tuple[str, tuple[int, ...]]:
    """A strategy's name and a mesh shape (``"4x2"`` or ``(4, 2)``) it can run on here."""
    strategy = validate.choice(strategy, list(STRATEGIES), "a strategy", error=specs.SpecError)
    if isinstance(mesh_shape, str):
        shape = specs.parse_mesh_shape(mesh_shape)
    else:
        shape = validate.sizes(mesh_shape, "The mesh shape", error=specs.SpecError)
    if strategy == "DP x TP" and len(shape) != 2:
        raise specs.SpecError("DP x TP needs a mesh with two axes, data and model, such as 4x2.")
    if strategy != "DP x TP" and len(shape) != 1:
        raise specs.SpecError(
            f"{strategy} uses one mesh axis; give one size such as 8, or pick DP x TP for two."
        )
    if math.prod(shape) > jax.device_count():
        raise specs.SpecError(
            f"The mesh {'x'.join(map(str, shape))} needs {math.prod(shape)} devices but there "
            f"are {jax.device_count()}; choose sizes that multiply to at most {jax.device_count()}."
        )
    return strategy, shape


@validate.impostors_refused
def check(strategy, mesh_shape, sizes=SIZES) -> Choice:
    """The ``Choice`` for a strategy, a mesh (``"4x2"`` or ``(4, 2)``) and four model sizes.

    The sizes may be typed text (a form's boxes); anything that cannot be compiled, or that
    does not split evenly over the mesh, is a ``SpecError`` with one sentence.
    """
    strategy, shape = _strategy_shape(strategy, mesh_shape)
    if isinstance(sizes, str) or not isinstance(sizes, (tuple, list)) or len(sizes) != 4:
        raise specs.SpecError(
            "sizes must be four whole numbers, book.models.Sizes(batch, features, hidden, "
            f"classes), not {validate.describe(sizes)}."
        )
    sizes = models.Sizes(*(_size(v, n) for v, n in zip(sizes, models.Sizes._fields)))
    data = shape[0] if strategy in ("DP", "FSDP", "DP x TP") else 1
    model = shape[-1] if strategy in ("TP", "DP x TP") else 1
    needs = [("batch", sizes.batch, data, "data")]
    if strategy == "FSDP":
        needs += [(n, getattr(sizes, n), data, "data") for n in ("features", "hidden", "classes")]
    if model > 1:
        needs.append(("hidden", sizes.hidden, model, "model"))
    for name, value, ways, axis in needs:
        if value % ways:
            raise specs.SpecError(
                f"{strategy} splits the {name} size {value} over the {ways} devices of "
                f"{axis}, which does not divide evenly; choose a {name} size divisible by "
                f"{ways}."
            )
    return Choice(strategy, shape, sizes)


def _on_mesh(strategy, mesh) -> str:
    """A strategy's name, checked with a mesh that ``mesh(strategy, ...)`` made."""
    strategy = validate.choice(strategy, list(STRATEGIES), "a strategy", error=specs.SpecError)
    if not isinstance(mesh, jax.sharding.Mesh) or mesh.axis_names != AXES[strategy]:
        raise specs.SpecError(
            f"Pass the mesh that book.strategies.mesh({strategy!r}, shape) makes, with the axes "
            f"{AXES[strategy]}, not {validate.describe(mesh)}."
        )
    return strategy


@validate.impostors_refused
def analyze(strategy: str, mesh_shape: tuple[int, ...], sizes: models.Sizes = SIZES) -> Analysis:
    """Compile one step of ``strategy`` (cached) and read what it costs each device.

    The choice goes through ``check`` first, so one that cannot work is one sentence.
    Collectives over groups of a single device move nothing and are left out.
    """
    choice = check(strategy, mesh_shape, sizes)
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
