"""The transformer form (chapter 13): what a rules table makes each device hold and send.

A reader picks one of the chapter's rules tables (``RULES`` and ``SP_RULES`` of
``book.lessons.transformer``) or writes one, and a mesh shape; the mesh's axes are the ones
the table names, in the order it first names them. ``analyze`` compiles the chapter's own
training step for that layout and reads what each device holds, the memory of the step
(``memory_analysis``) and its collectives per step, loops counted; ``render_transformer``
shows them. The static twin pre-renders the chapter's tables on every mesh of 8 devices they
fit, reusing the steps the chapter compiled.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import math
from dataclasses import dataclass

from book import display, specs, static_forms, validate
from book.forms.common import first_sentence
from book.lessons import transformer as tr

TABLES = {**tr.RULES, "TP + SP": tr.SP_RULES}
EXPLAINED = {
    "DP": "The batch split over data, every parameter whole on every device.",
    "FSDP": "The batch and the parameters' embed dimension split over fsdp: weights are "
    "gathered where they are used.",
    "TP": "Heads, MLP units and vocabulary split over model, the batch whole: the stream is "
    "all-reduced after each sublayer.",
    "FSDP x TP": "FSDP over fsdp and TP over model, on two mesh axes.",
    "DP x FSDP x TP": "The batch over data and fsdp, embed over fsdp, heads, MLP units and "
    "vocabulary over model.",
    "TP + SP": "TP, with the stream between sublayers split by its sequence over model.",
}
BATCH, SEQ = 8, 16  # the chapter's batch on mock devices: every step of the form is this size
CONFIG = tr.Config()
LOGICAL_NAMES = ("batch", "seq", "embed", "heads", "mlp", "vocab", "layers")
MESH_SHAPES = ("8", "4x2", "2x4", "2x2x2")  # 1D, 2D and 3D meshes of 8 devices
_EXAMPLES = {1: "8", 2: "4x2", 3: "2x2x2"}
_MAX = {"batch": 1024, "seq": 1024}  # what a form compiles in reasonable time


def mesh_axes(rules: dict) -> tuple[str, ...]:
    """The mesh axes a rules table names, in the order it first names them."""
    axes = []
    for value in rules.values():
        for axis in (value,) if isinstance(value, str) else value or ():
            if axis not in axes:
                axes.append(axis)
    return tuple(axes)


def mesh_choices(table: str) -> list[str]:
    """The 8-device mesh shapes a table fits: one size per mesh axis it names."""
    rank = len(mesh_axes(TABLES[table]))
    return [m for m in MESH_SHAPES if len(specs.parse_mesh_shape(m)) == rank]


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
        axes = (value,) if isinstance(value, str) else value
        if value is not None and not (isinstance(axes, tuple) and axes):
            raise specs.SpecError(
                f"The rule for {key!r} is {validate.describe(value)}; give a mesh axis name, "
                "a tuple of them or None."
            )
        axes = tuple(validate.name(a, "A mesh axis", error=specs.SpecError) for a in axes or ())
        if len(set(axes)) < len(axes):
            raise specs.SpecError(f"The rule for {key!r} names a mesh axis twice; name it once.")
        checked[key] = axes[0] if len(axes) == 1 else axes or None
    return "your rules", checked


def check_transformer(rules, mesh_shape, batch=BATCH, seq=SEQ) -> Choice:
    """The ``Choice`` for what a reader picked or wrote, or ``SpecError`` with one sentence.

    Every parameter, and the batch of tokens, must divide evenly over the mesh axes its
    dimensions are split over: ``jax.jit`` refuses uneven input shardings.
    """
    import jax

    name, table = _rules(rules)
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
    """(what, logical names, shape) of every input a layout splits: the step's arguments."""
    params = [(path, n, shape) for path, (n, shape) in param_shapes().items()]
    return [("the batch of tokens", ("batch", None), (batch, seq)), *params]


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


def layout(choice: Choice):
    """The chapter's ``Layout`` of a choice, on the first devices, its axes ``Auto``."""
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
    return (
        tr.make_step(CONFIG, layout(choice)).lower(*_abstract_inputs(choice)).compile(INSPECT_ONLY)
    )


def _unnamed(choice: Choice) -> Choice:
    """The choice without its table's name: rules a reader writes out reuse the table's step."""
    return dataclasses.replace(choice, name="")


_GIVEN: dict = {}  # choice -> a step the chapter compiled already (see ``remember``)


def remember(programs: dict) -> None:
    """Use steps the chapter compiled: ``{(table, mesh text): compiled step}``.

    Each must be ``make_step(Config(), layout)`` of that table on that mesh for the form's
    batch; one whose inputs or shardings differ is not used, and the form compiles its own.
    """
    for (table, mesh_text), compiled in programs.items():
        choice = check_transformer(table, mesh_text)
        if _fits(compiled, choice):
            _GIVEN[_unnamed(choice)] = compiled


def analyze(rules, mesh_shape, batch=BATCH, seq=SEQ) -> Analysis:
    """Compile the chapter's step for a choice (once) and read what it costs each device."""
    return _analyze(check_transformer(rules, mesh_shape, batch, seq))


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
    trips = tr.loop_trips(compiled)
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


def render_transformer(rules, mesh_shape, batch=BATCH, seq=SEQ) -> str:
    """HTML for one choice of the transformer form: what a step costs each device.

    ``rules`` is a name of ``TABLES`` or a dict from logical names to mesh axes, ``mesh_shape``
    the text a reader types (``"8"``, ``"4x2"``). A bad choice gives its one sentence.
    """
    return display.styled(_answer(rules, mesh_shape, batch, seq))


def _answer(*typed) -> str:
    """The bare markup for what a reader picked: one step's costs, or why not."""
    try:
        analysis = analyze(*typed)
    except specs.SpecError as err:
        return display.error_html(str(err))
    except Exception as err:  # a compiler failure is shown, not raised, like any bad choice
        return display.error_html(f"The compiler could not build this step: {first_sentence(err)}.")
    return _body(analysis)


def _body(a: Analysis) -> str:
    from book import cost

    c = a.choice
    explained = EXPLAINED.get(c.name, "")
    head = (
        f"<div class='bk-viz'><b>{html.escape(c.name)} on {html.escape(c.where)}</b>: "
        f"rules {html.escape(str(dict(c.rules)))}; a batch of {c.batch} "
        f"sequences of {c.seq} tokens, {CONFIG.n_layers} layers, d_model {CONFIG.d_model}. "
        f"{html.escape(explained)}</div>"
    )
    model_bytes = sum(math.prod(p[1]) * 4 for p in a.params)
    param_table = display.table(
        ["parameter", "shape", "spec", "shard shape", "bytes per device"],
        [[p[0], str(p[1]), p[2], str(p[3]), p[4]] for p in a.params]
        + [["total", "", "", "", a.param_bytes]],
        title=f"Parameters on each device: {a.param_bytes:,} of the model's {model_bytes:,} "
        f"bytes ({a.param_bytes / model_bytes:.1%})",
    )
    memory_table = display.table(
        ["arguments", "outputs", "temporaries", "total"],
        [[a.argument_bytes, a.output_bytes, a.temp_bytes, a.total_bytes]],
        title="Bytes per device of one step, from compiled.memory_analysis()",
    )
    if a.collectives:
        kinds: dict = {}  # (op, mesh axes, runs per step) -> [how many, bytes sent per step]
        for r, axes, runs in a.collectives:
            axes = "device pairs" if r.op == "collective-permute" else axes
            entry = kinds.setdefault((r.op, axes, runs), [0, 0.0])
            entry[0] += 1
            entry[1] += runs * cost.ring_bytes(r)
        rows = [
            [op, axes, count, "per layer" if runs > 1 else "once", round(sent)]
            for (op, axes, runs), (count, sent) in kinds.items()
        ]
        total = round(sum(sent for _, sent in kinds.values()))
        rows.append(["total", "", sum(count for count, _ in kinds.values()), "", total])
        comm = display.table(
            ["collective", "mesh axes", "how many", "runs", "bytes sent per step (ring)"],
            rows,
            title=f"Collectives of one step, from the compiled HLO: those in the loops over "
            f"layers run once per layer, {CONFIG.n_layers} times",
        ).html
    else:
        comm = "<p class='bk-table'>No collectives: every device works on what it holds.</p>"
    return f"{head}{param_table.html}{memory_table.html}{comm}"


def static_transformer_explorer() -> str:
    """The form without a kernel: every table on every 8-device mesh it fits, pre-rendered."""
    return display.styled(
        static_forms.static_form(
            ("rules", list(TABLES)),
            lambda table: [("mesh shape", mesh_choices(table))],
            lambda table, mesh_text: _answer(table, mesh_text),
            note=f"The chapter's model, a batch of {BATCH} sequences of {SEQ} tokens. Run the "
            "notebook to call render_transformer with rules of your own.",
        )
    )


def transformer_explorer(programs: dict | None = None) -> static_forms.Form:
    """The transformer form: pick a rules table and a mesh; see one step's costs.

    ``programs`` are steps the chapter compiled already (see ``remember``), so that neither
    the twin nor the widget compiles them again. A kernel shows the live widget; the online
    book shows the pre-rendered twin.
    """
    remember(programs or {})
    return static_forms.Form(_widget(), static_transformer_explorer())


def _widget():
    """The live ipywidgets form around ``render_transformer``: each step compiles once."""
    import ipywidgets as w

    table_box = w.Dropdown(options=list(TABLES), value="DP", description="rules")
    mesh_box = w.Dropdown(description="mesh shape")
    out = w.HTML()

    def update(*_):
        out.value = render_transformer(table_box.value, mesh_box.value or "")

    def on_table(*_):
        choices = mesh_choices(table_box.value)
        keep = mesh_box.value if mesh_box.value in choices else choices[0]
        mesh_box.unobserve(update, names="value")
        mesh_box.options = choices
        mesh_box.value = keep
        mesh_box.observe(update, names="value")
        update()

    table_box.observe(on_table, names="value")
    mesh_box.observe(update, names="value")
    on_table()
    return w.VBox([w.HBox([table_box, mesh_box]), out])
