"""What the forms share: the meshes they offer and build, a first choice that sets the meshes
offered, and a short reason for a failure."""

from __future__ import annotations

import functools
import itertools

from book import specs, validate

AXIS_TYPES = ("Explicit", "Auto")
DEFAULT_NAMES = {1: "data", 2: "data, model", 3: "pipe, data, model"}


@validate.impostors_refused
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


@validate.impostors_refused
def mesh(mesh_shape, axis_names, axis_type: str = "Explicit"):
    """The mesh of a choice, built once: going back to a choice costs nothing."""
    import jax

    shape = validate.sizes(mesh_shape, "mesh_shape", error=specs.SpecError)
    names = validate.plain(axis_names)
    if not isinstance(names, (tuple, list)) or len(names) != len(shape):
        raise specs.SpecError(
            f"axis_names must name each of the {len(shape)} axes of {shape}, not "
            f"{validate.describe(axis_names)}."
        )
    names = tuple(validate.name(n, "An axis name", error=specs.SpecError) for n in names)
    axis_type = validate.choice(axis_type, list(AXIS_TYPES), "an axis type", error=specs.SpecError)
    specs.check_mesh(shape, names, len(jax.devices()))
    return _mesh(shape, names, axis_type)


@functools.lru_cache(maxsize=64)
def _mesh(mesh_shape: tuple[int, ...], axis_names: tuple[str, ...], axis_type: str):
    import jax
    from jax.sharding import AxisType

    kind = getattr(AxisType, axis_type)
    return jax.make_mesh(mesh_shape, axis_names, axis_types=(kind,) * len(mesh_shape))


def first_sentence(err) -> str:
    """The first sentence of an exception's message, short, for a form to show."""
    try:
        text = str(err).strip()
    except Exception:
        text = ""
    first = text.splitlines()[0] if text else type(err).__name__
    return first.split(". ")[0].rstrip(".")[:200]


def device_count_for(form: str, least: int = 2) -> int:
    """JAX's device count, or one sentence when a form has too few devices to show anything."""
    import jax

    from book.errors import ReaderError

    count = jax.device_count()
    if count < least:
        raise ReaderError(
            f"The {form} needs at least {least} devices, and JAX has {count}; on CPU, "
            "book.devices.setup(8) before anything else uses JAX gives 8 mock devices."
        )
    return count


def choice_then_mesh(label: str, options: list[str], meshes_for, render):
    """A widget of two dropdowns: a choice, then a mesh shape among those it allows.

    ``meshes_for(choice)`` lists the mesh shapes offered for a choice (the first is shown when
    the one picked before is not among them); ``render(choice, mesh)`` gives the HTML below.
    """
    import ipywidgets as w

    choice_box = w.Dropdown(options=options, value=options[0], description=label)
    mesh_box = w.Dropdown(description="mesh shape")
    out = w.HTML()

    def update(*_):
        out.value = render(choice_box.value, mesh_box.value or "")

    def on_choice(*_):
        meshes = meshes_for(choice_box.value)
        keep = mesh_box.value if mesh_box.value in meshes else meshes[0]
        mesh_box.unobserve(update, names="value")
        mesh_box.options = meshes
        mesh_box.value = keep
        mesh_box.observe(update, names="value")
        update()

    choice_box.observe(on_choice, names="value")
    mesh_box.observe(update, names="value")
    on_choice()
    return w.VBox([w.HBox([choice_box, mesh_box]), out])


def planner_boxes(layouts, chip_counts, chips: str) -> dict:
    """The model, chip, layout and chip-count dropdowns of the two planners' forms.

    The sizing and serving forms ask the same four questions of ``book.sizing``; only the
    layouts, chip counts and the count shown first differ.
    """
    import ipywidgets as w

    from book import sizing

    return {
        "model": w.Dropdown(options=list(sizing.PRESETS), description="model"),
        "hardware": w.Dropdown(options=list(sizing.HARDWARE), description="chip"),
        "layout": w.Dropdown(options=list(layouts), description="layout"),
        "chips": w.Dropdown(options=list(chip_counts), value=chips, description="chips"),
    }


def live(boxes: dict, render):
    """Boxes three to a row above ``render(*values)``'s HTML, answered again on every change."""
    import ipywidgets as w

    out = w.HTML()

    def update(*_):
        out.value = render(*(box.value for box in boxes.values()))

    for box in boxes.values():
        box.observe(update, names="value")
    update()
    items = list(boxes.values())
    return w.VBox([w.HBox(items[i : i + 3]) for i in range(0, len(items), 3)] + [out])
