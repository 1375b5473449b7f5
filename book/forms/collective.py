"""The collective explorer (chapter 05): each device's block before and after one collective.

The collective runs for real, through ``jax.shard_map`` on the mesh and axis a reader picks.
``check`` reads the reader's choice into a ``Choice``, ``render_collective`` shows it; the
static twin pre-renders every collective, mesh axis and option for the online book.
"""

from __future__ import annotations

import functools
import html
import math
import re
from dataclasses import dataclass, replace

import numpy as np

from book import display, specs, static_forms, validate
from book.forms.common import DEFAULT_NAMES, device_count_for, first_sentence, mesh, mesh_shapes

COLLECTIVES = ("psum", "pmean", "all_gather", "psum_scatter", "ppermute", "all_to_all")
MAX_BLOCK = 64
_PAIR = re.compile(r"\(\s*(-?[0-9]{1,9})\s*,\s*(-?[0-9]{1,9})\s*\)", re.ASCII)


@validate.impostors_refused
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


def _besides_pairs(text: str) -> str:
    """What ``text`` holds besides its pairs, the commas, blanks and brackets between them."""
    return re.sub(r"[\s,\[\]]", "", _PAIR.sub("", text))


@validate.impostors_refused
def parse_perm(text: str, size: int) -> tuple[tuple[int, int], ...]:
    """``"shift"``, ``"ring"`` or (source, destination) pairs such as ``"(0, 1), (1, 0)"``.

    Indices are positions along the axis. Raises ``SpecError`` unless every index is on the
    axis and no position sends or receives twice.
    """
    size = validate.whole(size, "The axis size", high=validate.MAX_DEVICES, error=specs.SpecError)
    text = validate.plain(text)
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
    body = text.strip()
    if body[:1] + body[-1:] == "()" and not _besides_pairs(body[1:-1]):
        body = body[1:-1]  # a tuple of pairs, as jax.lax.ppermute takes them
    if not pairs or _besides_pairs(body):
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


@dataclass(frozen=True)
class Choice:
    """One valid choice of the explorer, normalised: options a collective ignores are reset.

    ``dimension`` is the gather, scatter or split dimension, ``concat_dimension`` all_to_all's
    concat axis, ``pairs`` ppermute's (source, destination) positions along ``axis``.
    """

    collective: str
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    axis: str
    block: tuple[int, ...]
    dimension: int = 0
    concat_dimension: int = 0
    tiled: bool = False
    pairs: tuple[tuple[int, int], ...] = ()

    @property
    def axis_size(self) -> int:
        return self.mesh_shape[self.axis_names.index(self.axis)]


@validate.impostors_refused
def check_collective(
    collective, mesh_shape, axis, axis_names, block_shape, dimension, concat_dimension, tiled, perm
) -> Choice:
    """A valid choice of the collective explorer, normalised, or ``SpecError`` in one sentence."""
    import jax

    collective = validate.choice(collective, COLLECTIVES, "a collective", error=specs.SpecError)
    sizes = specs.parse_mesh_shape(mesh_shape)
    if axis_names is None:
        axis_names = DEFAULT_NAMES.get(len(sizes), ", ".join(f"a{k}" for k in range(len(sizes))))
    names = specs.parse_axis_names(axis_names)
    specs.check_mesh(sizes, names, jax.device_count())
    if isinstance(axis, str):
        axis = str.__str__(axis)  # the text itself, whatever a subclass redefines
    if not isinstance(axis, str) or axis not in names:
        raise specs.SpecError(
            f"Axis {validate.describe(axis)} is not in the mesh, whose axes are "
            f"{specs.names_text(names)}; use one of those names."
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
    choice = Choice(collective, sizes, names, axis, block)
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
        return replace(choice, dimension=dim, concat_dimension=concat, tiled=tiled)
    elif collective == "ppermute":
        return replace(choice, pairs=parse_perm(perm, n))
    if collective in ("all_gather", "psum_scatter"):
        return replace(choice, dimension=dim, tiled=tiled)
    return choice


@functools.lru_cache(maxsize=256)
def _program(c: Choice):
    """The jitted shard_map for one choice, kept so returning to a choice costs no compile."""
    import jax
    from jax.sharding import PartitionSpec as P

    lax = jax.lax
    axis, dim = c.axis, c.dimension
    ops = {
        "psum": lambda b: lax.psum(b, axis),
        "pmean": lambda b: lax.pmean(b, axis),
        "all_gather": lambda b: lax.all_gather(b, axis, axis=dim, tiled=c.tiled),
        "psum_scatter": lambda b: lax.psum_scatter(b, axis, scatter_dimension=dim, tiled=c.tiled),
        "ppermute": lambda b: lax.ppermute(b, axis, c.pairs),
        "all_to_all": lambda b: lax.all_to_all(b, axis, dim, c.concat_dimension, tiled=c.tiled),
    }
    lead = (1,) * len(c.mesh_shape)

    def body(b):
        out = ops[c.collective](b.reshape(c.block))
        return out.reshape(lead + out.shape)

    everywhere = P(*c.axis_names)
    on = mesh(c.mesh_shape, c.axis_names)
    return jax.jit(jax.shard_map(body, mesh=on, in_specs=everywhere, out_specs=everywhere))


@functools.lru_cache(maxsize=64)
def _inputs(sizes, names, block):
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    on = mesh(sizes, names)
    devices = np.asarray(on.devices)
    values = np.stack([block_values(d.id, block) for d in devices.ravel()])
    values = values.reshape(sizes + block)
    return values, jax.device_put(values, NamedSharding(on, P(*names)))


@validate.impostors_refused
def call_text(c: Choice) -> str:
    """The ``jax.lax`` call a choice runs, as a reader would write it."""
    options = {
        "all_gather": f", axis={c.dimension}, tiled={c.tiled}",
        "psum_scatter": f", scatter_dimension={c.dimension}, tiled={c.tiled}",
        "all_to_all": f", split_axis={c.dimension}, concat_axis={c.concat_dimension}, "
        f"tiled={c.tiled}",
        "ppermute": ", perm=[" + ", ".join(f"({a}, {b})" for a, b in c.pairs) + "]",
    }.get(c.collective, "")
    return f"jax.lax.{c.collective}(block, {c.axis!r}{options})"


@validate.impostors_refused
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
    typed = (collective, mesh_shape, axis, axis_names, block_shape, dimension, concat_dimension)
    return display.styled(_answer(*typed, tiled, perm, diagram))


def _answer(*typed) -> str:
    """The bare markup for what a reader picked: blocks before and after, or why not."""
    *checked, diagram = typed
    try:
        choice = check_collective(*checked)
        diagram = validate.flag(diagram, "diagram", error=specs.SpecError)
    except specs.SpecError as err:
        return display.error_html(str(err))
    try:
        return _body(choice, diagram)
    except Exception as err:  # a refusal the checks above did not foresee is still one sentence
        return display.error_html(f"JAX cannot run this choice: {first_sentence(err)}.")


@functools.lru_cache(maxsize=512)
def _body(c: Choice, diagram: bool) -> str:
    values, x = _inputs(c.mesh_shape, c.axis_names, c.block)
    out = np.asarray(_program(c)(x))
    devices = np.asarray(mesh(c.mesh_shape, c.axis_names).devices)
    labels, before, after = [], [], []
    for pos, device in np.ndenumerate(devices):
        coord = ", ".join(f"{n}={i}" for n, i in zip(c.axis_names, pos))
        labels.append(f"device {device.id} ({coord})")
        before.append(values[pos])
        after.append(out[pos])
    a = c.axis_names.index(c.axis)
    order = {pos: k for k, (pos, _) in enumerate(np.ndenumerate(devices))}
    groups = {}
    for pos in order:
        groups.setdefault(pos[:a] + pos[a + 1 :], []).append(order[pos])
    groups = list(groups.values())
    n = c.axis_size
    where = (
        f"all {n} devices take part"
        if len(groups) == 1
        else f"the {math.prod(c.mesh_shape)} devices form {len(groups)} groups of {n} along "
        f"{c.axis!r}, each running it on its own: "
        + ", ".join("[" + ", ".join(str(devices.ravel()[k].id) for k in g) + "]" for g in groups)
    )
    shape = c.mesh_shape
    mesh_text = f"{shape[0]}-device" if len(shape) == 1 else "x".join(map(str, shape))
    head = (
        f"<div><code>{html.escape(call_text(c))}</code> on the "
        f"{mesh_text} mesh ({html.escape(', '.join(c.axis_names))}): "
        f"{html.escape(where)}.</div>"
    )
    pairs_in = list(zip(labels, before))
    pairs_out = list(zip(labels, after))
    table = display.before_after_table(pairs_in, pairs_out).html
    picture = ""
    if diagram:
        reduce = {"psum": "sum", "pmean": "mean", "psum_scatter": "sum"}.get(c.collective)
        drawn = display.collective_diagram(
            pairs_in, pairs_out, reduce=reduce, groups=groups if reduce else None
        )
        svg = drawn.svg
        if svg is None:
            picture = f"<pre>{html.escape(drawn.text)}</pre>"
        else:
            picture = f"<div class='bk-diagram'>{svg[svg.find('<svg') :]}</div>"
    return f"<div class='bk-viz'>{head}{table}{picture}</div>"


def static_collective_explorer() -> str:
    """The collective explorer without a kernel: every collective, mesh axis and option.

    Each device's block has one value per device of the chosen axis, so every option is valid
    on every axis; the diagrams are left to the live form to keep the page light.
    """

    choices = []
    for shape in mesh_shapes(device_count_for("collective explorer")):
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
        perm = value if key == "perm" else "shift"
        return _answer(
            collective, shape_text, axis, None, f"({n},)", 0, 0, value == "True", perm, False
        )

    return display.styled(
        static_forms.static_form(
            ("collective", list(COLLECTIVES)),
            rest,
            render,
            note="Each device starts with one value per device of the axis: a leading 1, its "
            "device id, then the position. Run the notebook to change the block, the "
            "dimensions and the permutation, and to see the data-movement diagrams.",
        )
    )


def collective_explorer() -> static_forms.Form:
    """The collective explorer: pick a collective, a mesh and axis, and its options.

    A kernel shows the live widget; the online book shows the pre-rendered twin.
    """
    return static_forms.Form(_widget(), static_collective_explorer())


def _widget():
    """The live ipywidgets form around ``render_collective``."""
    import ipywidgets as w

    shapes = mesh_shapes(device_count_for("collective explorer"))
    kind_box = w.Dropdown(options=COLLECTIVES, value="psum", description="collective")
    mesh_box = w.Dropdown(
        options=[("x".join(map(str, s)), s) for s in shapes],
        value=shapes[0],
        description="mesh shape",
    )
    axis_box = w.Dropdown(description="axis")
    block_box = w.Text(value="(8,)", description="block shape")
    # Number boxes apply at every keystroke, as the text boxes do.
    dim_box = w.BoundedIntText(
        value=0, min=0, max=3, description="dimension", continuous_update=True
    )
    concat_box = w.BoundedIntText(
        value=0, min=0, max=3, description="concat dim", continuous_update=True
    )
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
