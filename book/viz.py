"""Pictures of sharded arrays and meshes: per-device value tables and graphviz diagrams.

The tables show the values each device really holds (read from ``addressable_shards``), for
arrays of any rank, so a reader can check a layout by hand. Diagrams are drawn by Graphviz's
``dot``/``neato`` when installed, and fall back to text otherwise.
"""

from __future__ import annotations

import functools
import html
import math
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np

from book import validate
from book.errors import ReaderError

PALETTE = (
    "#cfe2f3",
    "#fce5cd",
    "#d9ead3",
    "#f4cccc",
    "#d9d2e9",
    "#fff2cc",
    "#d0e0e3",
    "#ead1dc",
    "#b6d7a8",
    "#f9cb9c",
    "#a4c2f4",
    "#ffe599",
    "#b4a7d6",
    "#ea9999",
    "#a2c4c9",
    "#d5a6bd",
)
MAX_ROWS, MAX_COLS, MAX_SLICES = 8, 8, 4
MAX_BLOCKS = 256  # devices drawn in one table or diagram
DOT_SECONDS = 30  # a drawing Graphviz has not finished by then is shown as text


class VizError(ReaderError, ValueError):
    """Something passed to a picture that it cannot show, explained in one sentence."""


STYLE = """<style>
.bk-viz{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:11px;color:#222}
.bk-grid{display:grid;gap:6px;margin:4px 0}
.bk-dev{border:1px solid #999;border-radius:4px;padding:3px 5px}
.bk-dev b{font-size:13px}
.bk-idx{color:#555}
.bk-vals{border-collapse:collapse;margin-top:2px;font:inherit}
.bk-vals td{padding:0 2px;text-align:right;border:none;background:transparent}
.bk-sum{margin-top:4px;color:#333}
.bk-error{color:#a00;font-weight:bold}
</style>"""


class Rendered:
    """HTML for notebooks, with a plain-text twin for terminals and text-only outputs."""

    def __init__(self, html_text: str, text: str):
        self.html = html_text
        self.text = text

    def _repr_html_(self):
        return self.html

    def __repr__(self):
        return self.text


class Diagram:
    """A Graphviz drawing: SVG in notebooks when Graphviz is installed, text otherwise."""

    def __init__(self, source: str, text: str, engine: str = "dot"):
        self.source = source
        self.text = text
        self.engine = engine

    @functools.cached_property
    def svg(self) -> str | None:
        program = shutil.which(self.engine)
        if program is None:
            return None
        args = [program, "-Tsvg"] + (["-n2"] if self.engine == "neato" else [])
        try:
            done = subprocess.run(
                args,
                input=self.source,
                capture_output=True,
                text=True,
                check=True,
                timeout=DOT_SECONDS,
            )
        except (subprocess.SubprocessError, OSError):  # the text twin is shown instead
            return None
        return done.stdout

    def _repr_svg_(self):
        return self.svg

    def __repr__(self):
        return self.text


@dataclass(frozen=True)
class Summary:
    """Where an array's bytes live."""

    shape: tuple[int, ...]
    dtype: str
    shard_shape: tuple[int, ...]
    total_bytes: int
    bytes_per_device: int
    devices: int
    distinct_shards: int

    @property
    def replication(self) -> int:
        """How many devices hold each distinct shard."""
        return self.devices // self.distinct_shards


def _index_key(index, shape):
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def summarize(x) -> Summary:
    """Shard shape, bytes per device and replication of a ``jax.Array``."""
    validate.array(x, "summarize's argument")
    shards = x.addressable_shards
    keys = {_index_key(s.index, x.shape) for s in shards}
    per_device = {}
    for s in shards:
        per_device[s.device] = per_device.get(s.device, 0) + s.data.nbytes
    return Summary(
        shape=tuple(x.shape),
        dtype=str(x.dtype),
        shard_shape=tuple(x.sharding.shard_shape(x.shape)),
        total_bytes=int(x.nbytes),
        bytes_per_device=max(per_device.values()),
        devices=len(x.sharding.device_set),
        distinct_shards=len(keys),
    )


def _device_grid(x):
    """The devices of ``x`` arranged as rows x columns, following its mesh when it has one."""
    mesh = getattr(x.sharding, "mesh", None)
    if mesh is not None and hasattr(mesh, "devices"):
        grid = np.asarray(mesh.devices)
        names = tuple(mesh.axis_names)
    else:
        grid = np.array(sorted(x.sharding.device_set, key=lambda d: d.id), dtype=object)
        names = ("devices",)
    if grid.ndim == 1:
        grid = grid.reshape(1, -1)
        names = ("",) + names
    return grid.reshape(grid.shape[0], -1), names, np.asarray(mesh.devices).shape if mesh else None


def _fmt(v) -> str:
    if isinstance(v, (np.floating, float)):
        return f"{v:.4g}"
    return str(v)


def _slice_text(index, shape) -> str:
    parts = []
    for s, n in zip(index, shape):
        start, stop = s.indices(n)[:2]
        parts.append(":" if (start, stop) == (0, n) else f"{start}:{stop}")
    return "[" + ", ".join(parts) + "]"


def _matrix_html(values: np.ndarray) -> str:
    """A 0-2D block as a small table, trimmed with ellipses when it is large."""
    values = np.atleast_2d(values) if values.ndim < 2 else values
    rows = []
    for r in range(min(values.shape[0], MAX_ROWS)):
        cells = [_fmt(v) for v in values[r, :MAX_COLS]]
        if values.shape[1] > MAX_COLS:
            cells.append("…")
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    if values.shape[0] > MAX_ROWS:
        rows.append("<tr><td>⋮</td></tr>")
    return f"<table class='bk-vals'>{''.join(rows)}</table>"


def _block_html(values: np.ndarray) -> str:
    """Any rank: rank>2 blocks are shown as their leading-index 2D slices, labelled."""
    if values.ndim <= 2:
        return _matrix_html(values)
    lead = values.shape[:-2]
    parts = []
    for k, idx in enumerate(np.ndindex(*lead)):
        if k == MAX_SLICES:
            parts.append(f"<div class='bk-idx'>… {math.prod(lead) - k} more slices</div>")
            break
        label = "[" + ", ".join(map(str, idx)) + ", :, :]"
        parts.append(f"<div class='bk-idx'>{label}</div>{_matrix_html(values[idx])}")
    return "".join(parts)


def _block_text(values: np.ndarray) -> str:
    with np.printoptions(threshold=MAX_ROWS * MAX_COLS, edgeitems=3, linewidth=100):
        return np.array2string(values)


def shard_table(x, *, show_ids: bool = True, title: str | None = None, name: str = "x") -> Rendered:
    """Every device's shard of ``x``: its device id, mesh position, index and actual values.

    Devices holding the same slice share a colour, so replication is visible at a glance.
    ``name`` labels each index (``w1[0:2, :]``), so tables of several arrays tell them apart.
    """
    validate.array(x, "shard_table's argument")
    show_ids = validate.flag(show_ids, "show_ids", error=VizError)
    title = validate.optional_text(title, "the title", example="'x'", error=VizError)
    name = validate.text(name, "the name", example="'x'", limit=40, error=VizError)
    if len(x.sharding.device_set) > MAX_BLOCKS:
        raise VizError(
            f"The array spans {len(x.sharding.device_set)} devices; a table shows at most "
            f"{MAX_BLOCKS}."
        )
    grid, names, mesh_shape = _device_grid(x)
    by_device = {s.device: s for s in x.addressable_shards}
    keys = sorted({_index_key(s.index, x.shape) for s in by_device.values()})
    colour = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(keys)}
    cells, lines = [], []
    for r in range(grid.shape[0]):
        for c in range(grid.shape[1]):
            device = grid[r, c]
            shard = by_device.get(device)
            if shard is None:
                cells.append("<div class='bk-dev'>not addressable here</div>")
                continue
            values = np.asarray(shard.data)
            where = _slice_text(shard.index, x.shape)
            label_html = html.escape(name + where)
            head = f"<b>device {device.id}</b>" if show_ids else "<b>device</b>"
            bg = colour[_index_key(shard.index, x.shape)]
            cells.append(
                f"<div class='bk-dev' style='background:{bg}'>{head} "
                f"<span class='bk-idx'>{label_html}</span>{_block_html(values)}</div>"
            )
            label = f"device {device.id}" if show_ids else "device"
            lines.append(f"{label} {name}{where}:\n{_block_text(values)}")
    s = summarize(x)
    mesh_note = ""
    if mesh_shape is not None:
        mesh_note = (
            " on a " + "x".join(map(str, mesh_shape)) + " mesh " + str(tuple(n for n in names if n))
        )
    summary = (
        f"array {s.shape} {s.dtype}{mesh_note}: shard shape {s.shard_shape}, "
        f"{s.bytes_per_device:,} of {s.total_bytes:,} bytes per device, "
        f"each shard held by {s.replication} device{'s' if s.replication > 1 else ''}"
    )
    heading = f"<div><b>{html.escape(title)}</b></div>" if title else ""
    body = (
        f"{STYLE}<div class='bk-viz'>{heading}<div class='bk-grid' "
        f"style='grid-template-columns:repeat({grid.shape[1]},max-content)'>{''.join(cells)}</div>"
        f"<div class='bk-sum'>{html.escape(summary)}</div></div>"
    )
    text = "\n".join(([title] if title else []) + lines + [summary])
    return Rendered(body, text)


def error_html(message: str) -> str:
    """A reader's mistake, shown as its one sentence in place of a result."""
    message = message if isinstance(message, str) else validate.describe(message)
    return f"{STYLE}<div class='bk-viz bk-error'>{html.escape(message)}</div>"


def _quote(text: str) -> str:
    """A Graphviz string literal; newlines become line breaks in the label."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


_GRAPH_STYLE = (
    'graph [fontname="Helvetica"]; node [shape=box style="rounded,filled" fontname="Helvetica"];'
)


def mesh_diagram(mesh, *, title: str | None = None) -> Diagram:
    """The mesh as a grid of device ids at their mesh coordinates: device order made visible.

    Each box shows a device id and, below it, the device's coordinates along the mesh axes.
    """
    validate.mesh(mesh)
    title = validate.optional_text(title, "the title", example="'mesh'", error=VizError)
    if mesh.size > MAX_BLOCKS:
        raise VizError(f"The mesh has {mesh.size} devices; a diagram shows at most {MAX_BLOCKS}.")
    devices = np.asarray(mesh.devices)
    names = tuple(mesh.axis_names)
    grid = devices.reshape(1, -1) if devices.ndim == 1 else devices.reshape(devices.shape[0], -1)
    lines = ["digraph mesh {", _GRAPH_STYLE]
    step_x, step_y = 90, 60
    for pos, device in np.ndenumerate(devices):
        r, c = np.argwhere(grid == device)[0]
        coord = "(" + ", ".join(map(str, pos)) + ")"
        fill = PALETTE[device.id % len(PALETTE)]
        lines.append(
            f'd{device.id} [label=<<b>{device.id}</b><br/><font point-size="9">{coord}</font>> '
            f'fillcolor="{fill}" pos="{c * step_x},{-r * step_y}"];'
        )
    cols_name = names[-1] if devices.ndim <= 2 else "(" + ", ".join(names[1:]) + ")"
    lines.append(
        f'cols [shape=plaintext style="" label={_quote(cols_name + " →")} '
        f'pos="{(grid.shape[1] - 1) * step_x / 2},{step_y * 0.8}"];'
    )
    if devices.ndim > 1:
        lines.append(
            f'rows [shape=plaintext style="" label={_quote(names[0] + " ↓")} '
            f'pos="{-step_x * 0.9},{-(grid.shape[0] - 1) * step_y / 2}"];'
        )
    if title:
        lines.append(f"label={_quote(title)}; labelloc=t;")
    lines.append("}")
    shape = "x".join(map(str, devices.shape))
    text_rows = ["  ".join(f"{d.id:>2}" for d in row) for row in grid]
    text = f"{title + ': ' if title else ''}{shape} mesh {names}, device ids:\n" + "\n".join(
        text_rows
    )
    return Diagram("\n".join(lines), text, engine="neato")


def ring_diagram(labels, groups=None, *, title: str | None = None) -> Diagram:
    """Nodes around a circle, joined in the given order: a ring of devices as data travels it.

    ``labels`` are in ring order; ``groups`` (same length) colours nodes that share a chip.
    """
    labels = _labels(labels)
    n = len(labels)
    title = validate.optional_text(title, "the title", example="'ring'", error=VizError)
    if groups is not None and (
        not isinstance(groups, (list, tuple, np.ndarray)) or len(groups) != n
    ):
        raise VizError(
            f"groups must be a list with one entry per label ({n}), not "
            f"{validate.describe(groups)}."
        )
    groups = list(range(n)) if groups is None else [_group_key(g) for g in groups]
    colours = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(dict.fromkeys(groups))}
    radius = 40 + 22 * n
    lines = ["digraph ring {", _GRAPH_STYLE]
    for k, (label, group) in enumerate(zip(labels, groups)):
        angle = math.pi / 2 - 2 * math.pi * k / n
        x, y = radius * math.cos(angle), radius * math.sin(angle)
        lines.append(
            f'n{k} [label={_quote(str(label))} fillcolor="{colours[group]}" pos="{x:.0f},{y:.0f}"];'
        )
    lines += [f"n{k} -> n{(k + 1) % n};" for k in range(n)]
    if title:
        lines.append(f"label={_quote(title)}; labelloc=t;")
    lines.append("}")
    text = (f"{title}: " if title else "") + " -> ".join(map(str, labels)) + f" -> {labels[0]}"
    return Diagram("\n".join(lines), text, engine="neato")


def _labels(labels) -> list[str]:
    """Node labels: a non-empty list or tuple of short texts or numbers."""
    if isinstance(labels, np.ndarray):
        labels = labels.tolist()
    if not isinstance(labels, (list, tuple)) or not labels:
        raise VizError(
            f"labels must be a non-empty list of texts or numbers, not {validate.describe(labels)}."
        )
    if len(labels) > MAX_BLOCKS:
        raise VizError(f"There are {len(labels)} labels; a diagram shows at most {MAX_BLOCKS}.")
    out = []
    for label in labels:
        if isinstance(label, (str, int, float, np.integer, np.floating)) and not isinstance(
            label, bool
        ):
            shown = label if isinstance(label, str) else validate.describe(label)
            out.append(shown[:60])
        else:
            raise VizError(
                f"Each label must be a text or a number, not {validate.describe(label)}."
            )
    return out


def _group_key(group):
    try:
        hash(group)
    except TypeError:
        raise VizError(
            f"Each group must be a number or a text naming it, not {validate.describe(group)}."
        ) from None
    return group


# Collectives: what each device holds before and after, and where every value went.

_EDGE_COLOURS = (
    "#3c78d8",
    "#e69138",
    "#6aa84f",
    "#cc0000",
    "#674ea7",
    "#bf9000",
    "#45818e",
    "#a64d79",
)
_REDUCTIONS = {"sum": ("Σ", np.sum), "mean": ("mean", np.mean)}


def device_blocks(x) -> list[tuple[str, np.ndarray]]:
    """Each device's block of ``x`` in mesh order, labelled with its device id and mesh position.

    For the output of ``jax.shard_map`` this is exactly what each device's function returned,
    whether ``out_specs`` concatenates the blocks or promises they are equal.
    """
    validate.array(x, "device_blocks's argument")
    by_device = {s.device: np.asarray(s.data) for s in x.addressable_shards}
    mesh = getattr(x.sharding, "mesh", None)
    if mesh is None or not hasattr(mesh, "devices"):
        return [(f"device {d.id}", by_device[d]) for d in sorted(by_device, key=lambda d: d.id)]
    blocks = []
    for pos, device in np.ndenumerate(np.asarray(mesh.devices)):
        coord = ", ".join(f"{n}={i}" for n, i in zip(mesh.axis_names, pos))
        blocks.append((f"device {device.id} ({coord})", by_device[device]))
    return blocks


def _as_blocks(blocks) -> list[tuple[str, np.ndarray]]:
    """Accept a ``jax.Array``, (label, values) pairs, or bare per-device values."""
    import jax

    if isinstance(blocks, jax.Array):
        return device_blocks(blocks)
    if not isinstance(blocks, (list, tuple)) or not blocks:
        raise VizError(
            "Pass a jax.Array, or a list with one block per device (values, or (label, values) "
            f"pairs), not {validate.describe(blocks)}."
        )
    if len(blocks) > MAX_BLOCKS:
        raise VizError(f"There are {len(blocks)} blocks; a picture shows at most {MAX_BLOCKS}.")
    pairs = []
    for k, item in enumerate(blocks):
        label, values = f"device {k}", item
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            label, values = item[0][:60], item[1]
        try:
            values = np.asarray(values)
        except Exception:
            values = None
        if values is None or values.dtype.kind not in "biuf" or values.size > 4096:
            raise VizError(
                f"The block of {label} must be numbers (at most 4096 of them), not "
                f"{validate.describe(item)}."
            )
        pairs.append((label, values))
    return pairs


def _inline_text(values: np.ndarray, max_rows: int = 4) -> str:
    """A block in a few short lines, for diagram nodes."""
    values = np.asarray(values)
    if values.ndim == 0:
        return _fmt(values[()])
    rows = values.reshape(-1, values.shape[-1]) if values.ndim > 1 else values[None]
    lines = []
    for row in rows[:max_rows]:
        cells = [_fmt(v) for v in row[:MAX_COLS]] + (["…"] if row.size > MAX_COLS else [])
        lines.append("[" + " ".join(cells) + "]")
    if rows.shape[0] > max_rows:
        lines.append(f"⋮ {'×'.join(map(str, values.shape))}")
    return "\n".join(lines)


def before_after_table(
    before, after, *, title: str | None = None, headers: tuple[str, str] = ("before", "after")
) -> Rendered:
    """One row per device: the block it held before a collective and the block it holds after.

    ``before`` and ``after`` are ``jax.Array``s (read with ``device_blocks``) or per-device
    lists, in the same device order. Each device keeps its colour in both columns.
    """
    before, after = _as_blocks(before), _as_blocks(after)
    title = validate.optional_text(title, "the title", example="'psum'", error=VizError)
    if (
        not isinstance(headers, (tuple, list))
        or len(headers) != 2
        or not all(isinstance(h, str) for h in headers)
    ):
        raise VizError(
            f"headers must be two texts, such as ('before', 'after'), not "
            f"{validate.describe(headers)}."
        )
    if len(before) != len(after):
        raise VizError(f"{len(before)} blocks before but {len(after)} after; pass one per device.")
    head = "".join(f"<div><b>{html.escape(h)}</b></div>" for h in ("device",) + tuple(headers))
    cells, lines = [head], []
    for k, ((label, b), (_, a)) in enumerate(zip(before, after)):
        bg = PALETTE[k % len(PALETTE)]
        cells.append(
            f"<div class='bk-dev' style='background:{bg}'><b>{html.escape(label)}</b></div>"
        )
        cells.append(f"<div class='bk-dev' style='background:{bg}'>{_block_html(b)}</div>")
        cells.append(f"<div class='bk-dev'>{_block_html(a)}</div>")
        lines.append(f"{label}: {_inline_text(b)} -> {_inline_text(a)}".replace("\n", " "))
    b0, a0 = before[0][1], after[0][1]
    summary = (
        f"each device: {headers[0]} {tuple(b0.shape)} {b0.dtype}, "
        f"{headers[1]} {tuple(a0.shape)} {a0.dtype}"
    )
    heading = f"<div><b>{html.escape(title)}</b></div>" if title else ""
    body = (
        f"{STYLE}<div class='bk-viz'>{heading}<div class='bk-grid' "
        f"style='grid-template-columns:repeat(3,max-content)'>{''.join(cells)}</div>"
        f"<div class='bk-sum'>{html.escape(summary)}</div></div>"
    )
    return Rendered(body, "\n".join(([title] if title else []) + lines + [summary]))


def trace_moves(before, after) -> tuple[dict[tuple[int, int], list], set[int]]:
    """Where every output value came from, found by looking it up among the inputs.

    Returns ``{(source, destination): [values]}`` and the destinations holding zeros that no
    input had (what ``ppermute`` writes where nobody sends). Inputs must hold distinct values.
    """
    before, after = _as_blocks(before), _as_blocks(after)
    home = {}
    for k, (_, b) in enumerate(before):
        for v in b.ravel().tolist():
            if v in home:
                raise VizError(
                    f"The value {v} appears twice among the inputs, so its path cannot be traced; "
                    "give every input element a distinct value."
                )
            home[v] = k
    moves, zeros = {}, set()
    for d, (label, a) in enumerate(after):
        for v in a.ravel().tolist():
            if v in home:
                moves.setdefault((home[v], d), []).append(v)
            elif v == 0:
                zeros.add(d)
            else:
                raise VizError(
                    f"{label} holds {v}, which no device held before; for a reduction pass "
                    "reduce='sum' or reduce='mean'."
                )
    return moves, zeros


def _reduced_parts(before, after, reduce, groups):
    """For each device, the group it reduces with and what it keeps of the group's result."""
    symbol, fn = _REDUCTIONS[reduce]
    parts = {}
    for g, members in enumerate(groups):
        total = fn(np.stack([before[k][1] for k in members]), axis=0)
        for rank, d in enumerate(members):
            a = after[d][1]
            if a.shape == total.shape and np.allclose(a, total):
                parts[d] = (g, total, "all")
                continue
            for dim in range(total.ndim):
                if total.shape[dim] % len(members):
                    continue
                piece = np.split(total, len(members), axis=dim)[rank]
                if piece.size == a.size and np.allclose(piece.reshape(a.shape), a):
                    parts[d] = (g, total, f"part {rank} of dim {dim}")
                    break
            else:
                raise VizError(
                    f"{after[d][0]} holds {_inline_text(a)!r}, which is neither the {reduce} of "
                    "its group's inputs nor an even part of it."
                )
    return symbol, parts


def _positions(groups, n) -> list[list[int]]:
    """Groups of device positions that together cover each of the ``n`` positions once."""
    message = (
        f"groups must be lists of device positions 0 to {n - 1}, each position in one group, "
        f"such as [[0, 1], [2, 3]], not {validate.describe(groups)}."
    )
    if not isinstance(groups, (list, tuple)) or not groups:
        raise VizError(message)
    out = []
    for group in groups:
        if not isinstance(group, (list, tuple)) or not group:
            raise VizError(message)
        out.append(
            [validate.whole(p, "A position", low=0, high=n - 1, error=VizError) for p in group]
        )
    if sorted(p for g in out for p in g) != list(range(n)):
        raise VizError(message)
    return out


def collective_diagram(
    before,
    after,
    *,
    reduce: str | None = None,
    groups=None,
    title: str | None = None,
    label_edges: bool | None = None,
) -> Diagram:
    """Where the data of a collective went: inputs on the left, outputs on the right.

    Without ``reduce`` every output value is traced back to the input that held it (see
    ``trace_moves``), and each arrow carries the values it moved, coloured by the sender. With
    ``reduce="sum"`` or ``"mean"`` the inputs meet in one node per group (``groups``: lists of
    device positions reduced together; default all) and each arrow out says what its device
    kept, checked against the actual values.
    """
    before, after = _as_blocks(before), _as_blocks(after)
    n = len(before)
    if len(after) != n:
        raise VizError(f"{n} blocks before but {len(after)} after; pass one per device.")
    title = validate.optional_text(title, "the title", example="'psum'", error=VizError)
    if label_edges is not None:
        label_edges = validate.flag(label_edges, "label_edges", error=VizError)
    groups = [list(range(n))] if groups is None else _positions(groups, n)
    if reduce is not None:
        reduce = validate.choice(reduce, list(_REDUCTIONS), "a reduction", error=VizError)
        symbol, parts = _reduced_parts(before, after, reduce, groups)
    labels_b = [label + "\n" + _inline_text(v) for label, v in before]
    labels_a = [label + "\n" + _inline_text(v) for label, v in after]
    if reduce is not None:
        labels_a = [
            t + ("" if parts[d][2] == "all" else f"\n({parts[d][2]})")
            for d, t in enumerate(labels_a)
        ]
        hubs = [symbol + "\n" + _inline_text(parts[g[0]][1]) for g in groups]
    else:
        hubs = []

    def wide(texts):
        return max((len(line) for t in texts for line in t.splitlines()), default=0) * 6.2 + 16

    rows = max(len(t.splitlines()) for t in labels_b + labels_a + hubs)
    step_y = max(48, 13 * rows + 22)
    wb, wa = wide(labels_b), wide(labels_a)
    if reduce is not None:
        x_hub = wb / 2 + 70 + wide(hubs) / 2
        x_after = x_hub + wide(hubs) / 2 + 70 + wa / 2
    else:
        x_after = wb / 2 + 200 + wa / 2
    lines = [
        "digraph collective {",
        _GRAPH_STYLE,
        'node [fontsize=10]; edge [fontname="Helvetica" fontsize=9 arrowsize=0.6];',
    ]
    for k, text in enumerate(labels_b):
        fill = PALETTE[k % len(PALETTE)]
        lines.append(f'b{k} [label={_quote(text)} fillcolor="{fill}" pos="0,{-k * step_y}"];')
    for k, text in enumerate(labels_a):
        lines.append(
            f'a{k} [label={_quote(text)} fillcolor="white" pos="{x_after:.0f},{-k * step_y}"];'
        )
    for name, x in (("before", 0), ("after", x_after)):
        lines.append(
            f'h_{name} [shape=plaintext style="" label="{name}" fontsize=12 '
            f'pos="{x:.0f},{step_y * 0.8:.0f}"];'
        )
    text = [title] if title else []
    if reduce is None:
        moves, zeros = trace_moves(before, after)
        show = label_edges if label_edges is not None else len(moves) <= 2 * n
        for (s, d), values in sorted(moves.items()):
            colour = _EDGE_COLOURS[s % len(_EDGE_COLOURS)]
            moved = " ".join(_fmt(v) for v in values[:6]) + (" …" if len(values) > 6 else "")
            label = f" label={_quote(moved)}" if show else ""
            lines.append(f'b{s} -> a{d} [color="{colour}" fontcolor="{colour}"{label}];')
            text.append(f"{before[s][0]} -> {after[d][0]}: {moved}")
        for d in sorted(zeros):
            text.append(f"{after[d][0]}: zeros, nobody sent to it")
    else:
        for g, members in enumerate(groups):
            centre = -sum(members) * step_y / len(members)
            lines.append(
                f'r{g} [label={_quote(hubs[g])} fillcolor="#eeeeee" '
                f'pos="{x_hub:.0f},{centre:.0f}"];'
            )
            for s in members:
                colour = _EDGE_COLOURS[s % len(_EDGE_COLOURS)]
                lines.append(f'b{s} -> r{g} [color="{colour}"];')
            names = ", ".join(before[s][0] for s in members)
            text.append(f"{symbol} of {names} = " + hubs[g].split("\n", 1)[1].replace("\n", " "))
        for d in range(n):
            lines.append(f"r{parts[d][0]} -> a{d};")
            text.append(f"{after[d][0]} keeps {parts[d][2]}: {_inline_text(after[d][1])}")
    if title:
        lines.append(f"label={_quote(title)}; labelloc=t;")
    lines.append("}")
    return Diagram("\n".join(lines), "\n".join(text), engine="neato")
