"""Chapter 13's layouts as compiled programs, for the layout form and exercise 13.3.

A layout is one of the chapter's rules tables (``RULES`` and ``SP_RULES`` of
``book.lessons.transformer``), or rules a reader writes, on a mesh whose axes are the ones the
rules name, in the order they first name them. ``analyze`` compiles the chapter's own
training step for it, on a small batch, and reads what each device holds, the step's memory
(``memory_analysis``) and its collectives, loops counted. ``check`` refuses a choice that
cannot work in one sentence (``book.specs.SpecError``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from dataclasses import dataclass

from book import hlo, specs, validate
from book.lessons import transformer as tr

TABLES = {**tr.RULES, "TP + SP": tr.SP_RULES}
BATCH, SEQ = 8, 16  # the chapter's batch on mock devices: every step here is this size
CONFIG = tr.Config()
LOGICAL_NAMES = ("batch", "seq", "embed", "heads", "mlp", "vocab", "layers")
_MAX = {"batch": 1024, "seq": 1024}  # what compiles in the time a reader should wait
_EXAMPLES = {1: "8", 2: "4x2", 3: "2x2x2"}


@validate.impostors_refused
def mesh_axes(rules: dict) -> tuple[str, ...]:
    """The mesh axes a rules table names, in the order it first names them."""
    rules = validate.plain_mapping(rules)
    if not isinstance(rules, dict):
        raise specs.SpecError(
            f"The rules must be a dict from logical names to mesh axes, not "
            f"{validate.describe(rules)}."
        )
    axes = []
    for key, value in rules.items():
        for axis in _axes(key, value):
            if axis not in axes:
                axes.append(axis)
    return tuple(axes)


def _axes(key, value) -> tuple[str, ...]:
    """The mesh axes of one rule: an axis name, a tuple of them, or None for none."""
    value = validate.plain(value)
    axes = (value,) if isinstance(value, str) else value
    if value is not None and not (isinstance(axes, tuple) and axes):
        raise specs.SpecError(
            f"The rule for {validate.describe(key)} is {validate.describe(value)}; give a mesh "
            "axis name, a tuple of them or None."
        )
    axes = tuple(validate.name(a, "A mesh axis", error=specs.SpecError) for a in axes or ())
    if len(set(axes)) < len(axes):
        raise specs.SpecError(
            f"The rule for {validate.describe(key)} names a mesh axis twice; name it once."
        )
    return axes


@dataclass(frozen=True)
class Choice:
    """One valid choice: a rules table (its name, or "your rules"), a named mesh, a batch."""

    name: str
    rules: tuple  # ((logical name, mesh axes), ...): a dict frozen, so a choice is hashable
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    batch: int
    seq: int

    @property
    def mesh_text(self) -> str:
        return "x".join(map(str, self.mesh_shape))

    @property
    def where(self) -> str:
        """The mesh in words: ``8 devices in a line (data)``, ``the 4x2 mesh (fsdp, model)``."""
        axes = ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.mesh_shape))
        if len(self.mesh_shape) == 1:
            return f"{self.mesh_shape[0]} devices in a line ({axes})"
        return f"the {self.mesh_text} mesh ({axes})"


def _rules(rules) -> tuple[str, dict]:
    """A table's name and its rules, from a name of ``TABLES`` or a dict a reader wrote."""
    rules = validate.plain_mapping(validate.plain(rules))
    if isinstance(rules, str):
        name = validate.choice(rules, list(TABLES), "a rules table", error=specs.SpecError)
        return name, TABLES[name]
    if not isinstance(rules, dict):
        raise specs.SpecError(
            f"The rules must be a table's name or a dict from logical names to mesh axes, "
            f"not {validate.describe(rules)}."
        )
    checked = {}
    for key, value in rules.items():
        if not isinstance(key, str) or key not in LOGICAL_NAMES:
            raise specs.SpecError(
                f"{validate.describe(key)} is not a logical name of this model; use "
                f"{', '.join(LOGICAL_NAMES[:-1])} or {LOGICAL_NAMES[-1]}."
            )
        axes = _axes(key, value)
        checked[key] = axes[0] if len(axes) == 1 else axes or None
    return "your rules", checked


@validate.impostors_refused
def check(rules, mesh_shape, batch=BATCH, seq=SEQ) -> Choice:
    """The ``Choice`` for what a reader picked or wrote, or ``SpecError`` with one sentence.

    Every parameter, and the batch of tokens, must divide evenly over the mesh axes its
    dimensions are split over: ``jax.jit`` refuses uneven input shardings.
    """
    import jax

    name, table = _rules(rules)
    mesh_shape = validate.plain(mesh_shape)
    if isinstance(mesh_shape, (tuple, list)):  # sizes as numbers, as code may pass them
        sizes = validate.sizes(mesh_shape, "the mesh shape", error=specs.SpecError)
        mesh_shape = "x".join(map(str, sizes))
    elif not isinstance(mesh_shape, str):
        raise specs.SpecError(
            "The mesh shape must be text such as '4x2' or sizes such as (4, 2), not "
            f"{validate.describe(mesh_shape)}."
        )
    shape = specs.parse_mesh_shape(mesh_shape)
    sizes = {
        k: validate.whole(
            v, f"The {k} size", high=_MAX[k], text=True, example=d, error=specs.SpecError
        )
        for k, v, d in (("batch", batch, BATCH), ("seq", seq, SEQ))
    }
    axes = mesh_axes(table)
    whose = f"{name}'s" if name != "your rules" else "These"
    if not axes:
        raise specs.SpecError(
            f"{whose} rules name no mesh axis, so nothing is split; map a logical name to an axis."
        )
    if len(axes) != len(shape):
        named = f"{len(axes)} mesh axes, {', '.join(axes)}" if len(axes) > 1 else axes[0]
        raise specs.SpecError(
            f"{whose} rules name {named}, but the mesh {mesh_shape.strip()} has "
            f"{len(shape)} size{'s' * (len(shape) > 1)}; give one size per axis, such as "
            f"{_EXAMPLES.get(len(axes), 'x'.join(['2'] * len(axes)))}."
        )
    if math.prod(shape) > jax.device_count():
        raise specs.SpecError(
            f"The mesh {'x'.join(map(str, shape))} needs {math.prod(shape)} devices but there "
            f"are {jax.device_count()}; choose sizes that multiply to at most "
            f"{jax.device_count()}."
        )
    ways = dict(zip(axes, shape))
    for what, names, dims in _inputs(sizes["batch"], sizes["seq"]):
        for logical, entry, size in zip(names, tr.logical_spec(names, table), dims):
            split = (entry,) if isinstance(entry, str) else entry or ()
            n = math.prod(ways[a] for a in split)
            if size % n:
                raise specs.SpecError(
                    f"{whose} rules split the {logical} dimension of {what}, {size}, over "
                    f"{' x '.join(split)} ({n} devices), which does not divide evenly; choose "
                    "other mesh sizes or rules."
                )
    rules_key = tuple(sorted(table.items()))
    return Choice(name, rules_key, shape, axes, sizes["batch"], sizes["seq"])


@functools.cache
def param_shapes() -> dict:
    """Each parameter's path, logical names and shape, from the chapter's PARAM_AXES."""
    import jax

    params = tr.init_params(CONFIG)  # NumPy arrays: no device is touched
    names = jax.tree_util.tree_leaves_with_path(
        tr.PARAM_AXES, is_leaf=lambda n: isinstance(n, tuple)
    )
    return {
        "/".join(str(getattr(k, "key", k)) for k in path): (n, p.shape)
        for (path, n), p in zip(names, jax.tree.leaves(params), strict=True)
    }


def _inputs(batch: int, seq: int):
    """(what, logical names, shape) of every array a layout splits by its rules: the step's
    arguments, and the residual stream the blocks pin to the layout (split unevenly, it would
    be padded)."""
    params = [(path, n, shape) for path, (n, shape) in param_shapes().items()]
    stream = ("the residual stream", tr.STREAM, (batch, seq, CONFIG.d_model))
    return [("the batch of tokens", ("batch", None), (batch, seq)), *params, stream]


@dataclass(frozen=True)
class Analysis:
    """What one compiled step costs each device: its parameters, memory and collectives."""

    choice: Choice
    params: tuple  # (path, shape, spec text, shard shape, bytes per device) per parameter
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    collectives: tuple  # (book.hlo row, mesh axes, runs per step) for groups of 2 or more

    @property
    def param_bytes(self) -> int:
        return sum(p[4] for p in self.params)

    @property
    def total_bytes(self) -> int:
        """Bytes per device of the step: its arguments, outputs and temporaries."""
        return self.argument_bytes + self.output_bytes + self.temp_bytes


@validate.impostors_refused
def layout(choice: Choice):
    """The chapter's ``Layout`` of a choice, on the first devices, its axes ``Auto``."""
    if not isinstance(choice, Choice):
        raise specs.SpecError(
            f"layout takes a Choice, as book.layouts.check returns it, not "
            f"{validate.describe(choice)}."
        )
    return tr.Layout(_mesh(choice.mesh_shape, choice.axis_names), dict(choice.rules))


@functools.cache
def _mesh(shape, names):
    import jax
    from jax.sharding import AxisType

    devices = jax.devices()[: math.prod(shape)]
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=devices)


def _abstract_inputs(choice: Choice):
    """Shapes and dtypes of the step's arguments, so that it compiles without data."""
    import jax
    import numpy as np

    params = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), tr.init_params(CONFIG))
    tokens = jax.ShapeDtypeStruct((choice.batch, choice.seq), np.int32)
    return params, tokens, tokens


def _fits(compiled, choice: Choice) -> bool:
    """Whether a step compiled elsewhere takes this choice's inputs, sharded as it shards them."""
    import jax

    try:
        want = jax.tree.leaves(_abstract_inputs(choice))
        got = jax.tree.leaves(compiled.args_info)
        given = jax.tree.leaves(compiled.input_shardings[0])
        lay = layout(choice)
        shardings = [*jax.tree.leaves(tr.param_shardings(lay, tr.PARAM_AXES))]
        shardings += [lay.sharding(("batch", None))] * 2
        return (
            len(got) == len(want) == len(given) == len(shardings)
            and all(g.shape == w.shape and g.dtype == w.dtype for g, w in zip(got, want))
            and all(g.is_equivalent_to(s, len(w.shape)) for g, s, w in zip(given, shardings, want))
        )
    except Exception:  # anything else is not a step of this form
        return False


INSPECT_ONLY = {"xla_backend_optimization_level": 0}  # inspected, never run: compile quickly


@functools.lru_cache(maxsize=64)
def _compiled(choice: Choice):
    """The step compiled for a choice; the partitioner's rematerialization notes kept off the page.

    What such a note describes is in the compiled program, so among the collectives shown, and
    chapter 18 explains it; anything else XLA logs still reaches standard error.
    """
    with hlo.compiler_messages() as log:
        step = tr.make_step(CONFIG, layout(choice))
        compiled = step.lower(*_abstract_inputs(choice)).compile(INSPECT_ONLY)
    other = [line for line in log.lines if "rematerialization" not in line]
    if other:
        print("\n".join(other), file=sys.stderr)
    return compiled


def _unnamed(choice: Choice) -> Choice:
    """The choice without its table's name: rules a reader writes out reuse the table's step."""
    return dataclasses.replace(choice, name="")


_GIVEN: dict = {}  # choice -> a step the chapter compiled already (see ``remember``)


@validate.impostors_refused
def remember(programs: dict) -> None:
    """Use steps the chapter compiled: ``{(table, mesh text): compiled step}``.

    Each must be ``make_step(Config(), layout)`` of that table on that mesh for a batch of
    ``BATCH`` sequences of ``SEQ`` tokens; one whose inputs or shardings differ is not used,
    and ``analyze`` compiles its own.
    """
    given, programs = programs, validate.plain_mapping(programs)
    if not isinstance(programs, dict):
        raise specs.SpecError(
            "programs must be a dict from (table, mesh shape) to a compiled step, not "
            f"{validate.describe(given)}."
        )
    for key, compiled in programs.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise specs.SpecError(
                f"Each key of programs is a (table, mesh shape) pair such as ('TP', '8'), not "
                f"{validate.describe(key)}."
            )
        choice = check(*key)
        if _fits(compiled, choice):
            _GIVEN[_unnamed(choice)] = compiled


@validate.impostors_refused
def analyze(rules, mesh_shape, batch=BATCH, seq=SEQ) -> Analysis:
    """Compile the chapter's step for a choice (once) and read what it costs each device."""
    return _analyze(check(rules, mesh_shape, batch, seq))


@functools.lru_cache(maxsize=64)
def _analyze(choice: Choice) -> Analysis:
    from book import hlo

    compiled = _GIVEN.get(_unnamed(choice)) or _compiled(_unnamed(choice))
    lay = layout(choice)
    params = []
    for path, (names, shape) in param_shapes().items():
        spec = tr.logical_spec(names, lay.rules)
        shard = lay.sharding(names).shard_shape(shape)
        params.append((path, shape, specs.spec_text(spec), shard, math.prod(shard) * 4))
    trips = hlo.loop_trips(compiled)
    rows = tuple(
        (r, tr.axes_of(r, lay.mesh), trips.get(r.computation, 1))
        for r in hlo.collectives(compiled)
        if r.group_size > 1
    )
    memory = compiled.memory_analysis()
    return Analysis(
        choice=choice,
        params=tuple(params),
        argument_bytes=memory.argument_size_in_bytes,
        output_bytes=memory.output_size_in_bytes,
        temp_bytes=memory.temp_size_in_bytes,
        collectives=rows,
    )
