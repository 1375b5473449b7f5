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
