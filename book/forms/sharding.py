"""The sharding explorer (chapter 02): where each value of an array lives for a mesh and a spec.

``check`` reads what a reader types into a ``Choice``, ``render`` places the array for real and
shows every device's values; the static twin pre-renders every spec for the online book.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np
from jax.sharding import PartitionSpec

from book import display, specs, static_forms, validate
from book.forms.common import AXIS_TYPES, DEFAULT_NAMES, first_sentence, mesh, mesh_shapes

MAX_ELEMENTS = 4096
STATIC_RANK = 3  # every spec of every dimension is pre-rendered: 10 choices per dimension


@dataclass(frozen=True)
class Choice:
    """One valid choice of the explorer."""

    shape: tuple[int, ...]
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    spec: PartitionSpec
    axis_type: str = "Explicit"
    show_ids: bool = True


@validate.impostors_refused
def spec_choices(axis_names) -> list[str]:
    """What one array dimension can be sharded over: nothing, one axis, or two axes together."""
    axis_names = validate.plain(axis_names)
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


def _small_enough(shape) -> None:
    if math.prod(shape) > MAX_ELEMENTS:
        raise specs.SpecError(
            f"The array has {math.prod(shape):,} elements; keep it under {MAX_ELEMENTS:,} so "
            "every value fits on the page."
        )


@validate.impostors_refused
def check(array_shape, mesh_shape, axis_names, spec, axis_type="Explicit", show_ids=True):
    """The ``Choice`` for what a reader typed, or ``SpecError`` with one sentence."""
    import jax

    choice = Choice(
        shape=specs.parse_shape(array_shape),
        mesh_shape=specs.parse_mesh_shape(mesh_shape),
        axis_names=specs.parse_axis_names(axis_names),
        spec=specs.parse_partition_spec(spec),
        axis_type=validate.choice(axis_type, AXIS_TYPES, "an axis type", error=specs.SpecError),
        show_ids=validate.flag(show_ids, "show_ids", error=specs.SpecError),
    )
    _small_enough(choice.shape)
    specs.check_mesh(choice.mesh_shape, choice.axis_names, jax.device_count())
    placed_on = mesh(choice.mesh_shape, choice.axis_names, choice.axis_type)
    specs.check_sharding(choice.shape, placed_on, choice.spec)
    return choice


def _body(choice: Choice) -> str:
    import jax
    from jax.sharding import NamedSharding

    values = np.arange(math.prod(choice.shape), dtype=np.int32).reshape(choice.shape)
    placed_on = mesh(choice.mesh_shape, choice.axis_names, choice.axis_type)
    x = jax.device_put(values, NamedSharding(placed_on, choice.spec))
    title = f"{choice.shape} sharded as {specs.spec_text(choice.spec)}"
    return display.shard_table(x, show_ids=choice.show_ids, title=title).html


@validate.impostors_refused
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
    return display.styled(_answer(array_shape, mesh_shape, axis_names, spec, axis_type, show_ids))


def _answer(*typed) -> str:
    """The bare markup for what a reader typed: the table, or one sentence saying why not."""
    try:
        choice = check(*typed)
    except specs.SpecError as err:
        return display.error_html(str(err))
    try:
        return _body(choice)
    except Exception as err:  # a refusal the checks above did not foresee is still one sentence
        return display.error_html(f"JAX cannot place this array: {first_sentence(err)}.")


@validate.impostors_refused
def static_sharding_explorer(array_shape: str = "(8, 4)") -> str:
    """The explorer without a kernel: every mesh shape and spec pre-rendered for one array.

    Axis names are the defaults for each mesh rank, and the axis type is left out: it changes
    how later operations propagate shardings, not where the values of this array live.
    """
    import jax

    shape = specs.parse_shape(array_shape)
    array_shape = validate.plain(array_shape)  # the text itself, whatever a subclass redefines
    rank = len(shape)
    if rank > STATIC_RANK:
        raise specs.SpecError(
            f"The page pre-renders every spec for arrays of rank at most {STATIC_RANK}, and "
            f"{array_shape.strip()} has rank {rank}; type it into the live form instead."
        )
    _small_enough(shape)

    def names(mesh_text):
        return DEFAULT_NAMES[len(specs.parse_mesh_shape(mesh_text))]

    def dims(mesh_text):
        choices = spec_choices(specs.parse_axis_names(names(mesh_text)))
        return [(f"dim {k}", choices) for k in range(rank)]

    def render(mesh_text, *entries):
        return _answer(array_shape, mesh_text, names(mesh_text), "P(" + ", ".join(entries) + ")")

    meshes = ["x".join(map(str, s)) for s in mesh_shapes(jax.device_count())]
    return display.styled(
        static_forms.static_form(
            ("mesh shape", meshes),
            dims,
            render,
            note=f"Array {array_shape} of its own flat indices; axis names follow the mesh "
            "rank. Run the notebook to change the array and the names.",
        )
    )


@validate.impostors_refused
def sharding_explorer(array_shape: str = "(8, 4)") -> static_forms.Form:
    """The sharding explorer: pick mesh, axis names and types, and a spec per array dimension.

    A kernel shows the live widget; the online book shows the pre-rendered twin.
    """
    static = static_sharding_explorer(array_shape)  # checks the shape before a widget holds it
    return static_forms.Form(_widget(validate.plain(array_shape)), static)


def _widget(array_shape: str):
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
    # names for the mesh shown first: a 1-D mesh (no 2x4 on few devices) gets one name
    names_box = w.Text(value=DEFAULT_NAMES[len(mesh_box.value)], description="axis names")
    ids_box = w.Checkbox(value=True, description="show device ids")
    dims_box = w.HBox()
    spec_label = w.HTML()
    out = w.HTML()
    chosen: list[str] = []  # the reader's pick for each dimension, kept while it does not fit

    def names_or_empty():
        try:
            return specs.parse_axis_names(names_box.value)
        except specs.SpecError:
            return ()

    def rebuild_dims(*_):
        """New dimension menus for a shape and names that parse; else keep the ones shown.

        Every keystroke arrives here, so a half-typed "(8, " or "('data', " must not lose the
        spec: until the text parses, only the sentence saying why changes.
        """
        try:
            rank = len(specs.parse_shape(shape_box.value))
            choices = spec_choices(specs.parse_axis_names(names_box.value))
        except specs.SpecError:
            update()
            return
        dims = []
        for k in range(rank):
            keep = chosen[k] if k < len(chosen) and chosen[k] in choices else "None"
            dims.append(w.Dropdown(options=choices, value=keep, description=f"dim {k}"))
            dims[k].observe(functools.partial(pick, k), names="value")
        dims_box.children = dims
        update()

    def pick(k, change):
        chosen.extend(["None"] * (k + 1 - len(chosen)))
        chosen[k] = change["new"]
        update()

    def on_mesh(change):
        if len(names_or_empty()) != len(change["new"]):
            names_box.value = DEFAULT_NAMES.get(len(change["new"]), names_box.value)
        update()

    def update(*_):
        spec = "P(" + ", ".join(d.value for d in dims_box.children) + ")"
        spec_label.value = f"<code>{spec}</code>"
        out.value = render_sharding(
            shape_box.value, str(mesh_box.value), names_box.value, spec, show_ids=ids_box.value
        )

    shape_box.observe(rebuild_dims, names="value")
    names_box.observe(rebuild_dims, names="value")
    mesh_box.observe(on_mesh, names="value")
    ids_box.observe(update, names="value")
    rebuild_dims()
    controls = w.VBox([w.HBox([shape_box, mesh_box]), w.HBox([names_box, ids_box])])
    return w.VBox([controls, dims_box, spec_label, out])
