"""Interactive forms: thin ipywidgets wiring around pure functions that return HTML.

The pure functions take exactly what a reader types or picks, so tests call them directly and a
static page can show them pre-rendered. A bad choice comes back as HTML holding one sentence
saying what to change; these functions never raise for a reader's input.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from book import specs, static_forms, viz

AXIS_TYPES = ("Explicit", "Auto")
DEFAULT_NAMES = {1: "data", 2: "data, model", 3: "pipe, data, model"}
MAX_ELEMENTS = 4096


def mesh_shapes(device_count: int) -> list[tuple[int, ...]]:
    """Mesh shapes that use every device: 1D, all 2D splits, and 3D splits without 1s."""
    shapes = [(device_count,)]
    divisors = [d for d in range(1, device_count + 1) if device_count % d == 0]
    shapes += [(a, device_count // a) for a in divisors]
    for a, b in itertools.product(divisors[1:], repeat=2):
        c, rest = divmod(device_count, a * b)
        if rest == 0 and c > 1:
            shapes.append((a, b, c))
    return shapes


def spec_choices(axis_names) -> list[str]:
    """What one array dimension can be sharded over: nothing, one axis, or two axes together."""
    names = list(axis_names)
    choices = ["None"] + [repr(n) for n in names]
    choices += [f"({a!r}, {b!r})" for a, b in itertools.permutations(names, 2)]
    return choices


@functools.lru_cache(maxsize=64)
def _mesh(mesh_shape, axis_names, axis_type):
    import jax
    from jax.sharding import AxisType

    kind = getattr(AxisType, axis_type)
    return jax.make_mesh(mesh_shape, axis_names, axis_types=(kind,) * len(mesh_shape))


def render_sharding(
    array_shape: str,
    mesh_shape: str,
    axis_names: str,
    spec: str,
    axis_type: str = "Explicit",
    show_ids: bool = True,
) -> str:
    """HTML for one choice in the sharding explorer: per-device values and bytes, or why not.

    All four main arguments are the texts a reader types, e.g. ``"(8, 4)"``, ``"(2, 4)"``,
    ``"('data', 'model')"`` and ``"P('data', None)"``.
    """
    import jax
    from jax.sharding import NamedSharding

    try:
        shape = specs.parse_shape(array_shape)
        mesh_sizes = specs.parse_mesh_shape(mesh_shape)
        names = specs.parse_axis_names(axis_names)
        partition = specs.parse_partition_spec(spec)
        if axis_type not in AXIS_TYPES:
            raise specs.SpecError(f"Pick an axis type among {', '.join(AXIS_TYPES)}.")
        if math.prod(shape) > MAX_ELEMENTS:
            raise specs.SpecError(
                f"The array has {math.prod(shape):,} elements; keep it under {MAX_ELEMENTS:,} "
                "so every value fits on the page."
            )
        specs.check_mesh(mesh_sizes, names, jax.device_count())
        mesh = _mesh(mesh_sizes, names, axis_type)
        specs.check_sharding(shape, mesh, partition)
    except specs.SpecError as err:
        return viz.error_html(str(err))
    values = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
    x = jax.device_put(values, NamedSharding(mesh, partition))
    title = f"{tuple(shape)} sharded as {_spec_repr(partition)}"
    return viz.shard_table(x, show_ids=show_ids, title=title).html


def _spec_repr(partition) -> str:
    return "P(" + ", ".join(repr(e) for e in partition) + ")"


def static_sharding_explorer(array_shape: str = "(8, 4)") -> str:
    """The explorer without a kernel: every mesh shape and spec pre-rendered for one array.

    Axis names are the defaults for each mesh rank, and the axis type is left out: it changes
    how later operations propagate shardings, not where the values of this array live.
    """
    import jax

    rank = len(specs.parse_shape(array_shape))

    def dims(mesh_text):
        names = specs.parse_axis_names(DEFAULT_NAMES[len(specs.parse_mesh_shape(mesh_text))])
        return [(f"dim {k}", spec_choices(names)) for k in range(rank)]

    def render(mesh_text, *entries):
        names = DEFAULT_NAMES[len(specs.parse_mesh_shape(mesh_text))]
        spec = "P(" + ", ".join(entries) + ")"
        shown = render_sharding(array_shape, mesh_text, names, spec)
        return shown.replace(viz.STYLE, "")

    meshes = ["x".join(map(str, s)) for s in mesh_shapes(jax.device_count())]
    return viz.STYLE + static_forms.static_form(
        ("mesh shape", meshes),
        dims,
        render,
        note=f"Array {array_shape} of its own flat indices; axis names follow the mesh "
        "rank. Run the notebook to change the array, the names and the axis types.",
    )


def sharding_explorer(array_shape: str = "(8, 4)") -> static_forms.Form:
    """The sharding explorer: pick mesh, axis names and types, and a spec per array dimension.

    A kernel shows the live widget; the online book shows the pre-rendered twin.
    """
    return static_forms.Form(_sharding_widget(array_shape), static_sharding_explorer(array_shape))


def _sharding_widget(array_shape: str):
    """The live ipywidgets form around ``render_sharding``."""
    import ipywidgets as w
    import jax

    shapes = mesh_shapes(jax.device_count())
    shape_box = w.Text(value=array_shape, description="array shape")
    mesh_box = w.Dropdown(
        options=[("x".join(map(str, s)), s) for s in shapes],
        value=(2, 4) if (2, 4) in shapes else shapes[0],
        description="mesh shape",
    )
    names_box = w.Text(value=DEFAULT_NAMES[2], description="axis names")
    type_box = w.Dropdown(options=AXIS_TYPES, value="Explicit", description="axis types")
    ids_box = w.Checkbox(value=True, description="show device ids")
    dims_box = w.HBox()
    spec_label = w.HTML()
    out = w.HTML()

    def names_or_empty():
        try:
            return specs.parse_axis_names(names_box.value)
        except specs.SpecError:
            return ()

    def rank():
        try:
            return len(specs.parse_shape(shape_box.value))
        except specs.SpecError:
            return 0

    def rebuild_dims(*_):
        old = [d.value for d in dims_box.children]
        choices = spec_choices(names_or_empty())
        dims = []
        for k in range(rank()):
            keep = old[k] if k < len(old) and old[k] in choices else "None"
            dims.append(w.Dropdown(options=choices, value=keep, description=f"dim {k}"))
        for d in dims:
            d.observe(update, names="value")
        dims_box.children = dims
        update()

    def on_mesh(change):
        if len(names_or_empty()) != len(change["new"]):
            names_box.value = DEFAULT_NAMES.get(len(change["new"]), names_box.value)
        update()

    def update(*_):
        spec = "P(" + ", ".join(d.value for d in dims_box.children) + ")"
        spec_label.value = f"<code>{spec}</code>"
        out.value = render_sharding(
            shape_box.value,
            str(mesh_box.value),
            names_box.value,
            spec,
            type_box.value,
            ids_box.value,
        )

    shape_box.observe(rebuild_dims, names="value")
    names_box.observe(rebuild_dims, names="value")
    mesh_box.observe(on_mesh, names="value")
    type_box.observe(update, names="value")
    ids_box.observe(update, names="value")
    rebuild_dims()
    controls = w.VBox([w.HBox([shape_box, mesh_box]), w.HBox([names_box, type_box, ids_box])])
    return w.VBox([controls, dims_box, spec_label, out])


# The strategy form (chapter 09): per-device parameters, memory and collectives of one
# training step of each Part III strategy, compiled for the mesh a reader picks.

STRATEGY_EXPLAINED = {
    "DP": "Parameters replicated, batch split over data: one all-reduce averages the gradients.",
    "FSDP": "Parameters and batch split over data: each weight is all-gathered before use, and "
    "the gradients come back reduce-scattered.",
    "TP": "w1 split by columns and w2 by rows over model, batch replicated: only the logits "
    "cross devices, in one all-reduce.",
    "DP x TP": "Batch split over data, weights over model as in TP: the logits are all-reduced "
    "within each model group and the gradients across the data groups.",
}
STRATEGY_SIZES = {"batch": 256, "features": 64, "hidden": 256, "classes": 16}
MAX_MODEL_SIZE = 65536


def strategy_mesh_choices(strategy: str, device_count: int) -> list[str]:
    """Mesh shapes the strategy form offers: axis sizes ..., 4, 2 that fit the devices.

    One axis for DP, FSDP and TP; for DP x TP, every ``data x model`` split of all devices
    with both axes at least 2. The largest mesh comes first, so it is what a form shows first.
    """
    sizes = [2**k for k in range(device_count.bit_length() - 1, 0, -1)]
    if strategy == "DP x TP":
        return [f"{a}x{device_count // a}" for a in sizes if 2 <= device_count // a]
    return [str(k) for k in sizes]


def _whole_number(value, name: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise specs.SpecError(f"The {name} must be a positive whole number, not {value!r}.")
    if value > MAX_MODEL_SIZE:
        raise specs.SpecError(
            f"The {name} {value:,} is too large; keep it at most {MAX_MODEL_SIZE:,}."
        )
    return value


def check_strategy(strategy, mesh_shape, batch, features, hidden, classes):
    """The mesh shape and sizes of a valid choice, or ``SpecError`` with one sentence."""
    import jax

    from book import models

    if strategy not in STRATEGY_EXPLAINED:
        raise specs.SpecError(
            f"{strategy!r} is not a strategy here; pick one of DP, FSDP, TP or DP x TP."
        )
    shape = specs.parse_mesh_shape(mesh_shape)
    sizes = models.Sizes(
        *(_whole_number(v, n) for v, n in zip((batch, features, hidden, classes), STRATEGY_SIZES))
    )
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
    return shape, sizes


def render_strategy(
    strategy: str,
    mesh_shape: str,
    batch=STRATEGY_SIZES["batch"],
    features=STRATEGY_SIZES["features"],
    hidden=STRATEGY_SIZES["hidden"],
    classes=STRATEGY_SIZES["classes"],
) -> str:
    """HTML for one choice in the strategy form: what one training step costs each device.

    ``strategy`` is one of ``book.strategies.STRATEGIES``, ``mesh_shape`` the text a reader
    types (``"8"``, ``"4x2"``). The step is compiled once per choice and cached, so going back
    to an earlier choice is immediate. A bad choice gives its one-sentence explanation.
    """
    from book import strategies

    try:
        shape, sizes = check_strategy(strategy, mesh_shape, batch, features, hidden, classes)
    except specs.SpecError as err:
        return viz.error_html(str(err))
    try:
        analysis = strategies.analyze(strategy, shape, sizes)
    except Exception as err:  # a compiler failure is shown, not raised, like any bad choice
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return viz.error_html(f"The compiler could not build this step: {first}")
    return _strategy_html(analysis)


def _strategy_html(a) -> str:
    import html

    from book import cost, hlo, strategies

    axes = ", ".join(
        f"{name}={size}" for name, size in zip(strategies.AXES[a.strategy], a.mesh_shape)
    )
    if len(a.mesh_shape) == 1:
        mesh_text = f"{a.mesh_shape[0]}-device"
    else:
        mesh_text = "x".join(map(str, a.mesh_shape))
    s = a.sizes
    head = (
        f"<div class='bk-viz'><b>{html.escape(a.strategy)} on a "
        f"{mesh_text} mesh ({html.escape(axes)})</b>: batch {s.batch}, "
        f"MLP {s.features} → {s.hidden} → {s.classes}. "
        f"{html.escape(STRATEGY_EXPLAINED[a.strategy])}</div>"
    )
    model_bytes = sum(math.prod(shape) * 4 for shape, *_ in a.param_shards.values())
    params = [
        [name, str(shape), _spec_repr(spec), str(shard), nbytes]
        for name, (shape, spec, shard, nbytes) in a.param_shards.items()
    ]
    params.append(["total", "", "", "", a.param_bytes])
    param_table = hlo.table(
        ["parameter", "shape", "spec", "shard shape", "bytes per device"],
        params,
        title=f"Parameters on each device: {a.param_bytes:,} of the model's {model_bytes:,} "
        f"bytes ({a.param_bytes / model_bytes:.1%})",
    )
    memory_table = hlo.table(
        ["arguments", "outputs", "temporaries", "total"],
        [
            [
                a.argument_bytes,
                a.output_bytes,
                a.temp_bytes,
                a.argument_bytes + a.output_bytes + a.temp_bytes,
            ]
        ],
        title="Bytes per device of one step, from compiled.memory_analysis()",
    )
    if a.collectives:
        rows = [
            [k, r.op, _collective_shape(r), r.group_size, r.bytes, round(cost.ring_bytes(r))]
            for k, r in enumerate(a.collectives)
        ]
        rows.append(["", "total", "", "", sum(r.bytes for r in a.collectives), round(a.sent_bytes)])
        comm = hlo.table(
            [
                "#",
                "collective",
                "shape per device",
                "group size",
                "result bytes",
                "bytes sent (ring)",
            ],
            rows,
            title="Collectives of one step (from the compiled HLO)",
        ).html
    else:
        comm = "<p class='bk-hlo'>No collectives: every device works on what it holds.</p>"
    return f"{viz.STYLE}{head}{param_table.html}{memory_table.html}{comm}"


def _collective_shape(row) -> str:
    """A collective's shape per device; a tuple of arrays is listed part by part."""
    if row.shape and isinstance(row.shape[0], tuple):
        return " + ".join(str(list(part)) for part in row.shape)
    return str(list(row.shape))


def static_strategy_explorer() -> str:
    """The strategy form without a kernel: every strategy and mesh choice pre-rendered."""
    import jax

    count = jax.device_count()
    return viz.STYLE + static_forms.static_form(
        ("strategy", list(STRATEGY_EXPLAINED)),
        lambda strategy: [("mesh shape", strategy_mesh_choices(strategy, count))],
        lambda strategy, mesh: render_strategy(strategy, mesh).replace(viz.STYLE, ""),
        note="Model sizes: batch 256, MLP 64 → 256 → 16. Run the notebook to change them.",
    )


def strategy_explorer() -> static_forms.Form:
    """The strategy form: pick a strategy, a mesh shape and sizes; see one step's costs.

    A kernel shows the live widget; the online book shows the pre-rendered twin.
    """
    return static_forms.Form(_strategy_widget(), static_strategy_explorer())


def _strategy_widget():
    """The live ipywidgets form around ``render_strategy``."""
    import ipywidgets as w
    import jax

    count = jax.device_count()
    strategy_box = w.Dropdown(options=list(STRATEGY_EXPLAINED), value="DP", description="strategy")
    mesh_box = w.Dropdown(description="mesh shape")
    size_boxes = {
        name: w.Dropdown(
            options=sorted({default // 4, default, default * 4}), value=default, description=name
        )
        for name, default in STRATEGY_SIZES.items()
    }
    out = w.HTML()

    def update(*_):
        sizes = {name: box.value for name, box in size_boxes.items()}
        out.value = render_strategy(strategy_box.value, mesh_box.value or "", **sizes)

    def on_strategy(*_):
        choices = strategy_mesh_choices(strategy_box.value, count)
        keep = mesh_box.value if mesh_box.value in choices else choices[0]
        mesh_box.unobserve(update, names="value")
        mesh_box.options = choices
        mesh_box.value = keep
        mesh_box.observe(update, names="value")
        update()

    strategy_box.observe(on_strategy, names="value")
    mesh_box.observe(update, names="value")
    for box in size_boxes.values():
        box.observe(update, names="value")
    on_strategy()
    controls = w.VBox([w.HBox([strategy_box, mesh_box]), w.HBox(list(size_boxes.values()))])
    return w.VBox([controls, out])
