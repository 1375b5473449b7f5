"""Interactive forms: thin ipywidgets wiring around pure functions that return HTML.

The pure functions take exactly what a reader types or picks, so tests call them directly and a
static page can show them pre-rendered. A bad choice comes back as HTML holding one sentence
saying what to change; these functions never raise for a reader's input.
"""

from __future__ import annotations

import functools
import html
import itertools
import math
import re

import numpy as np

from book import specs, static_forms, validate, viz

AXIS_TYPES = ("Explicit", "Auto")
DEFAULT_NAMES = {1: "data", 2: "data, model", 3: "pipe, data, model"}
MAX_ELEMENTS = 4096
STATIC_RANK = 3  # every spec of every dimension is pre-rendered: 10 choices per dimension


def mesh_shapes(device_count: int) -> list[tuple[int, ...]]:
    """Mesh shapes that use every device: 1D, all 2D splits, and 3D splits without 1s."""
    device_count = validate.whole(
        device_count, "The device count", high=validate.MAX_DEVICES, error=specs.SpecError
    )
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
    if isinstance(axis_names, str) or not isinstance(axis_names, (tuple, list)):
        raise specs.SpecError(
            "The axis names must be a tuple of names such as ('data', 'model'), not "
            f"{validate.describe(axis_names)}."
        )
    if len(axis_names) > validate.MAX_AXES:
        raise specs.SpecError(
            f"There are {len(axis_names)} axis names; use at most {validate.MAX_AXES}."
        )
    names = [validate.name(n, "Each axis name", error=specs.SpecError) for n in axis_names]
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
        axis_type = validate.choice(axis_type, AXIS_TYPES, "an axis type", error=specs.SpecError)
        show_ids = validate.flag(show_ids, "show_ids", error=specs.SpecError)
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
    try:
        values = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
        x = jax.device_put(values, NamedSharding(mesh, partition))
    except Exception as err:  # a refusal the checks above did not foresee is still one sentence
        return viz.error_html(f"JAX cannot place this array: {_first_sentence(err)}.")
    title = f"{tuple(shape)} sharded as {_spec_repr(partition)}"
    return viz.shard_table(x, show_ids=show_ids, title=title).html


def _first_sentence(err) -> str:
    """The first sentence of an exception's message, short, for a form to show."""
    try:
        text = str(err).strip()
    except Exception:
        text = ""
    first = text.splitlines()[0] if text else type(err).__name__
    return first.split(". ")[0].rstrip(".")[:200]


def _spec_repr(partition) -> str:
    return "P(" + ", ".join(repr(e) for e in partition) + ")"


def static_sharding_explorer(array_shape: str = "(8, 4)") -> str:
    """The explorer without a kernel: every mesh shape and spec pre-rendered for one array.

    Axis names are the defaults for each mesh rank, and the axis type is left out: it changes
    how later operations propagate shardings, not where the values of this array live.
    """
    import jax

    shape = specs.parse_shape(array_shape)
    rank = len(shape)
    if rank > STATIC_RANK:
        raise specs.SpecError(
            f"The page pre-renders every spec for arrays of rank at most {STATIC_RANK}, and "
            f"{array_shape.strip()} has rank {rank}; type it into the live form instead."
        )
    if math.prod(shape) > MAX_ELEMENTS:
        raise specs.SpecError(
            f"The array has {math.prod(shape):,} elements; keep it under {MAX_ELEMENTS:,} so "
            "every value fits on the page."
        )

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
    strategy = validate.choice(
        strategy, list(STRATEGY_EXPLAINED), "a strategy", error=specs.SpecError
    )
    device_count = validate.whole(
        device_count, "The device count", high=validate.MAX_DEVICES, error=specs.SpecError
    )
    sizes = [2**k for k in range(device_count.bit_length() - 1, 0, -1)]
    if strategy == "DP x TP":
        return [f"{a}x{device_count // a}" for a in sizes if 2 <= device_count // a]
    return [str(k) for k in sizes]


def _whole_number(value, name: str) -> int:
    return validate.whole(
        value,
        f"The {name} size",
        high=MAX_MODEL_SIZE,
        text=True,
        example=STRATEGY_SIZES[name],
        too_large="more than a form can compile in reasonable time",
        error=specs.SpecError,
    )


def check_strategy(strategy, mesh_shape, batch, features, hidden, classes):
    """The mesh shape and sizes of a valid choice, or ``SpecError`` with one sentence."""
    import jax

    from book import models

    strategy = validate.choice(
        strategy, list(STRATEGY_EXPLAINED), "a strategy", error=specs.SpecError
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
        return viz.error_html(f"The compiler could not build this step: {_first_sentence(err)}.")
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
    """The live ipywidgets form around ``render_strategy``.

    It offers the strategies and meshes for the chapter's model: each such step compiles once
    and is cached, so every change answers at once. Other model sizes are for code cells
    (``render_strategy(..., batch=...)``), where waiting for a compile is expected.
    """
    import ipywidgets as w
    import jax

    count = jax.device_count()
    strategy_box = w.Dropdown(options=list(STRATEGY_EXPLAINED), value="DP", description="strategy")
    mesh_box = w.Dropdown(description="mesh shape")
    out = w.HTML()

    def update(*_):
        out.value = render_strategy(strategy_box.value, mesh_box.value or "")

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
    on_strategy()
    return w.VBox([w.HBox([strategy_box, mesh_box]), out])


# The collective explorer (chapter 05): each device's block before and after one collective,
# computed by jax.shard_map on the mesh and axis a reader picks.

COLLECTIVES = ("psum", "pmean", "all_gather", "psum_scatter", "ppermute", "all_to_all")
MAX_BLOCK = 64
_FIT_SVG = '<svg style="max-width:100%;height:auto"'  # shrink to the page, keep proportions
_PAIR = re.compile(r"\(\s*(-?[0-9]{1,9})\s*,\s*(-?[0-9]{1,9})\s*\)", re.ASCII)


def block_values(device_id: int, block: tuple[int, ...]) -> np.ndarray:
    """The block a device starts with: a leading 1, then its device id, then the position.

    With a block of up to 10 values device 3 holds 130, 131, ...; with up to 100, 1300, 1301,
    ... Every value is distinct and non-zero, so each output value names where it came from,
    and the zeros ``ppermute`` writes where nobody sends stand out.
    """
    device_id = validate.whole(
        device_id, "The device id", low=0, high=validate.MAX_DEVICES, error=specs.SpecError
    )
    block = validate.sizes(block, "The block shape", error=specs.SpecError)
    size = math.prod(block)
    if size > MAX_BLOCK:
        raise specs.SpecError(f"The block has {size:,} values; keep it at most {MAX_BLOCK}.")
    step = 10 ** len(str(max(size - 1, 0)))
    return (10 * step + device_id * step + np.arange(size, dtype=np.int32)).reshape(block)


def parse_perm(text: str, size: int) -> tuple[tuple[int, int], ...]:
    """``"shift"``, ``"ring"`` or (source, destination) pairs such as ``"(0, 1), (1, 0)"``.

    Indices are positions along the axis. Raises ``SpecError`` unless every index is on the
    axis and no position sends or receives twice.
    """
    size = validate.whole(size, "The axis size", high=validate.MAX_DEVICES, error=specs.SpecError)
    if not isinstance(text, str) or len(text) > specs.MAX_TEXT:
        raise specs.SpecError(
            f"Type the permutation as shift, ring, or pairs such as (0, 1), (1, 0), in under "
            f"{specs.MAX_TEXT} characters."
        )
    word = text.strip().lower()
    if word == "shift":
        return tuple((k, k + 1) for k in range(size - 1))
    if word == "ring":
        return tuple((k, (k + 1) % size) for k in range(size))
    pairs = [(int(a), int(b)) for a, b in _PAIR.findall(text)]
    if not pairs or re.sub(r"[\s,\[\]]", "", _PAIR.sub("", text)):
        raise specs.SpecError(
            f"Could not read {text.strip()!r} as a permutation; type shift, ring, or "
            "(source, destination) pairs such as (0, 1), (1, 0)."
        )
    for pair in pairs:
        for k in pair:
            if not 0 <= k < size:
                raise specs.SpecError(
                    f"The pair {pair} names index {k}, but the axis has {size} devices, "
                    f"indexed 0 to {size - 1}; use indices in that range."
                )
    for where, what in ((0, "sends"), (1, "receives")):
        seen = set()
        for pair in pairs:
            if pair[where] in seen:
                raise specs.SpecError(
                    f"Index {pair[where]} {what} twice in {text.strip()}, so it is not a "
                    f"permutation; let each index send at most once and receive at most once."
                )
            seen.add(pair[where])
    return tuple(pairs)


def _dimension(value, name: str) -> int:
    return validate.whole(
        value,
        f"The {name}",
        low=-validate.MAX_SIZE,
        text=True,
        example=0,
        error=specs.SpecError,
    )


def _check_dim(dim: int, rank: int, what: str, allowed: int) -> None:
    if not 0 <= dim < allowed:
        choices = ", ".join(map(str, range(allowed)))
        raise specs.SpecError(
            f"The {what} is {dim}, but for a block of rank {rank} it can only be {choices}; "
            "pick one of those."
        )


def _check_split(name, what, dim, length, n, axis, tiled):
    if tiled and length % n:
        raise specs.SpecError(
            f"{name} over {axis!r} splits {what} {dim} (size {length}) into {n} parts, which "
            f"does not divide evenly; make that size a multiple of {n}."
        )
    if not tiled and length != n:
        raise specs.SpecError(
            f"Without tiled, {name} needs {what} {dim} to have exactly {n} entries, one per "
            f"device of {axis!r}, but it has {length}; make it {n} or tick tiled."
        )


def check_collective(
    collective, mesh_shape, axis, axis_names, block_shape, dimension, concat_dimension, tiled, perm
):
    """A valid choice of the collective explorer, normalised, or ``SpecError`` in one sentence."""
    import jax

    collective = validate.choice(collective, COLLECTIVES, "a collective", error=specs.SpecError)
    sizes = specs.parse_mesh_shape(mesh_shape)
    if axis_names is None:
        axis_names = DEFAULT_NAMES.get(len(sizes), ", ".join(f"a{k}" for k in range(len(sizes))))
    names = specs.parse_axis_names(axis_names)
    specs.check_mesh(sizes, names, jax.device_count())
    if not isinstance(axis, str) or axis not in names:
        raise specs.SpecError(
            f"Axis {validate.describe(axis)} is not in the mesh, whose axes are "
            f"{specs._names_text(names)}; use one of those names."
        )
    n = sizes[names.index(axis)]
    block = specs.parse_shape(block_shape)
    if math.prod(block) > MAX_BLOCK:
        raise specs.SpecError(
            f"The block has {math.prod(block)} values; keep it at most {MAX_BLOCK} so every "
            "value fits on the page."
        )
    dim = _dimension(dimension, "dimension")
    concat = _dimension(concat_dimension, "concat dimension")
    tiled = validate.flag(tiled, "tiled", error=specs.SpecError)
    pairs = ()
    rank = len(block)
    if collective == "all_gather":
        _check_dim(dim, rank, "gather dimension", rank if tiled else rank + 1)
    elif collective == "psum_scatter":
        _check_dim(dim, rank, "scatter dimension", rank)
        _check_split("psum_scatter", "dimension", dim, block[dim], n, axis, tiled)
    elif collective == "all_to_all":
        _check_dim(dim, rank, "split dimension", rank)
        _check_dim(concat, rank, "concat dimension", rank)
        _check_split("all_to_all", "split dimension", dim, block[dim], n, axis, tiled)
    elif collective == "ppermute":
        pairs = parse_perm(perm, n)
    used = {
        "all_gather": (dim, 0, tiled),
        "psum_scatter": (dim, 0, tiled),
        "all_to_all": (dim, concat, tiled),
    }.get(collective, (0, 0, False))
    return (collective, sizes, names, axis, block, *used, pairs)


@functools.lru_cache(maxsize=256)
def _collective_program(collective, sizes, names, axis, block, dim, concat, tiled, pairs):
    """The jitted shard_map for one choice, kept so returning to a choice costs no compile."""
    import jax
    from jax.sharding import PartitionSpec as P

    lax = jax.lax
    ops = {
        "psum": lambda b: lax.psum(b, axis),
        "pmean": lambda b: lax.pmean(b, axis),
        "all_gather": lambda b: lax.all_gather(b, axis, axis=dim, tiled=tiled),
        "psum_scatter": lambda b: lax.psum_scatter(b, axis, scatter_dimension=dim, tiled=tiled),
        "ppermute": lambda b: lax.ppermute(b, axis, pairs),
        "all_to_all": lambda b: lax.all_to_all(b, axis, dim, concat, tiled=tiled),
    }
    lead = (1,) * len(sizes)

    def body(b):
        out = ops[collective](b.reshape(block))
        return out.reshape(lead + out.shape)

    everywhere = P(*names)
    mesh = _mesh(sizes, names, "Explicit")
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=everywhere, out_specs=everywhere))


@functools.lru_cache(maxsize=64)
def _collective_input(sizes, names, block):
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _mesh(sizes, names, "Explicit")
    devices = np.asarray(mesh.devices)
    values = np.stack([block_values(d.id, block) for d in devices.ravel()])
    values = values.reshape(sizes + block)
    return values, jax.device_put(values, NamedSharding(mesh, P(*names)))


def _call_text(collective, axis, dim, concat, tiled, pairs) -> str:
    options = {
        "all_gather": f", axis={dim}, tiled={tiled}",
        "psum_scatter": f", scatter_dimension={dim}, tiled={tiled}",
        "all_to_all": f", split_axis={dim}, concat_axis={concat}, tiled={tiled}",
        "ppermute": ", perm=[" + ", ".join(f"({a}, {b})" for a, b in pairs) + "]",
    }.get(collective, "")
    return f"jax.lax.{collective}(block, {axis!r}{options})"


def render_collective(
    collective: str = "psum",
    mesh_shape: str = "(8,)",
    axis: str = "data",
    *,
    axis_names: str | None = None,
    block_shape: str = "(8,)",
    dimension=0,
    concat_dimension=0,
    tiled: bool = False,
    perm: str = "shift",
    diagram: bool = True,
) -> str:
    """HTML for one choice in the collective explorer: every device's block before and after.

    The collective runs for real, inside ``jax.shard_map`` on a mesh of ``mesh_shape`` (axis
    names default to those of the sharding explorer), over one ``axis``; each device starts
    with ``block_values`` of ``block_shape``. ``dimension`` is the gather, scatter or split
    dimension, ``concat_dimension`` all_to_all's concat axis, ``perm`` ppermute's pairs.
    Options a collective does not take are ignored. A bad choice gives one sentence.
    """
    try:
        choice = check_collective(
            collective,
            mesh_shape,
            axis,
            axis_names,
            block_shape,
            dimension,
            concat_dimension,
            tiled,
            perm,
        )
        diagram = validate.flag(diagram, "diagram", error=specs.SpecError)
    except specs.SpecError as err:
        return viz.error_html(str(err))
    try:
        return _render_choice(choice, diagram)
    except Exception as err:  # a refusal the checks above did not foresee is still one sentence
        return viz.error_html(f"JAX cannot run this choice: {_first_sentence(err)}.")


@functools.lru_cache(maxsize=512)
def _render_choice(choice, diagram: bool) -> str:
    collective, sizes, names, axis, block, dim, concat, tiled, pairs = choice
    values, x = _collective_input(sizes, names, block)
    out = np.asarray(_collective_program(*choice)(x))
    mesh = _mesh(sizes, names, "Explicit")
    devices = np.asarray(mesh.devices)
    labels, before, after = [], [], []
    for pos, device in np.ndenumerate(devices):
        coord = ", ".join(f"{n}={i}" for n, i in zip(names, pos))
        labels.append(f"device {device.id} ({coord})")
        before.append(values[pos])
        after.append(out[pos])
    a = names.index(axis)
    order = {pos: k for k, (pos, _) in enumerate(np.ndenumerate(devices))}
    groups = {}
    for pos in order:
        groups.setdefault(pos[:a] + pos[a + 1 :], []).append(order[pos])
    groups = list(groups.values())
    call = _call_text(collective, axis, dim, concat, tiled, pairs)
    n = sizes[a]
    where = (
        f"all {n} devices take part"
        if len(groups) == 1
        else f"the {math.prod(sizes)} devices form {len(groups)} groups of {n} along "
        f"{axis!r}, each running it on its own: "
        + ", ".join("[" + ", ".join(str(devices.ravel()[k].id) for k in g) + "]" for g in groups)
    )
    head = (
        f"<div><code>{html.escape(call)}</code> on the {'x'.join(map(str, sizes))} mesh "
        f"({html.escape(', '.join(names))}): {html.escape(where)}.</div>"
    )
    pairs_in = list(zip(labels, before))
    pairs_out = list(zip(labels, after))
    table = viz.before_after_table(pairs_in, pairs_out).html.replace(viz.STYLE, "")
    picture = ""
    if diagram:
        reduce = {"psum": "sum", "pmean": "mean", "psum_scatter": "sum"}.get(collective)
        drawn = viz.collective_diagram(
            pairs_in, pairs_out, reduce=reduce, groups=groups if reduce else None
        )
        svg = drawn.svg
        if svg is None:
            picture = f"<pre>{html.escape(drawn.text)}</pre>"
        else:
            svg = svg[svg.find("<svg") :].replace("<svg", _FIT_SVG, 1)
            picture = f"<div class='bk-diagram'>{svg}</div>"
    return f"{viz.STYLE}<div class='bk-viz'>{head}{table}{picture}</div>"


def static_collective_explorer() -> str:
    """The collective explorer without a kernel: every collective, mesh axis and option.

    Each device's block has one value per device of the chosen axis, so every option is valid
    on every axis; the diagrams are left to the live form to keep the page light.
    """
    import jax

    count = jax.device_count()
    choices = []
    for shape in mesh_shapes(count):
        if 1 in shape:
            continue
        names = specs.parse_axis_names(DEFAULT_NAMES[len(shape)])
        text = "x".join(map(str, shape))
        choices += [f"{text}, axis {name}" for name in names]
    options = {
        "all_gather": ["tiled=False", "tiled=True"],
        "psum_scatter": ["tiled=False", "tiled=True"],
        "all_to_all": ["tiled=False", "tiled=True"],
        "ppermute": ["perm=shift", "perm=ring"],
    }

    def rest(collective):
        return [("mesh and axis", choices), ("option", options.get(collective, ["none"]))]

    def render(collective, mesh_axis, option):
        shape_text, axis = mesh_axis.split(", axis ")
        sizes = specs.parse_mesh_shape(shape_text)
        n = sizes[specs.parse_axis_names(DEFAULT_NAMES[len(sizes)]).index(axis)]
        key, _, value = option.partition("=")
        shown = render_collective(
            collective,
            shape_text,
            axis,
            block_shape=f"({n},)",
            tiled=value == "True",
            perm=value if key == "perm" else "shift",
            diagram=False,
        )
        return shown.replace(viz.STYLE, "")

    return viz.STYLE + static_forms.static_form(
        ("collective", list(COLLECTIVES)),
        rest,
        render,
        note="Each device starts with one value per device of the axis: a leading 1, its "
        "device id, then the position. Run the notebook to change the block, the dimensions "
        "and the permutation, and to see the data-movement diagrams.",
    )


def collective_explorer() -> static_forms.Form:
    """The collective explorer: pick a collective, a mesh and axis, and its options.

    A kernel shows the live widget; the online book shows the pre-rendered twin.
    """
    return static_forms.Form(_collective_widget(), static_collective_explorer())


def _collective_widget():
    """The live ipywidgets form around ``render_collective``."""
    import ipywidgets as w
    import jax

    shapes = mesh_shapes(jax.device_count())
    kind_box = w.Dropdown(options=COLLECTIVES, value="psum", description="collective")
    mesh_box = w.Dropdown(
        options=[("x".join(map(str, s)), s) for s in shapes],
        value=shapes[0],
        description="mesh shape",
    )
    axis_box = w.Dropdown(description="axis")
    block_box = w.Text(value="(8,)", description="block shape")
    dim_box = w.BoundedIntText(value=0, min=0, max=3, description="dimension")
    concat_box = w.BoundedIntText(value=0, min=0, max=3, description="concat dim")
    tiled_box = w.Checkbox(value=False, description="tiled")
    perm_box = w.Text(value="shift", description="perm")
    out = w.HTML()

    def update(*_):
        out.value = render_collective(
            kind_box.value,
            "x".join(map(str, mesh_box.value)),
            axis_box.value or "",
            block_shape=block_box.value,
            dimension=dim_box.value,
            concat_dimension=concat_box.value,
            tiled=tiled_box.value,
            perm=perm_box.value,
        )

    def on_mesh(*_):
        names = list(specs.parse_axis_names(DEFAULT_NAMES[len(mesh_box.value)]))
        axis_box.unobserve(update, names="value")
        keep = axis_box.value if axis_box.value in names else names[-1]
        axis_box.options = names
        axis_box.value = keep
        axis_box.observe(update, names="value")
        update()

    def on_kind(*_):
        kind = kind_box.value
        dim_box.layout.display = (
            "" if kind in ("all_gather", "psum_scatter", "all_to_all") else "none"
        )
        concat_box.layout.display = "" if kind == "all_to_all" else "none"
        tiled_box.layout.display = dim_box.layout.display
        perm_box.layout.display = "" if kind == "ppermute" else "none"
        update()

    kind_box.observe(on_kind, names="value")
    mesh_box.observe(on_mesh, names="value")
    axis_box.observe(update, names="value")
    for box in (block_box, dim_box, concat_box, tiled_box, perm_box):
        box.observe(update, names="value")
    on_mesh()
    on_kind()
    controls = w.VBox(
        [
            w.HBox([kind_box, mesh_box, axis_box]),
            w.HBox([block_box, dim_box, concat_box, tiled_box, perm_box]),
        ]
    )
    return w.VBox([controls, out])
