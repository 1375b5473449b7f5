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
        done = subprocess.run(args, input=self.source, capture_output=True, text=True, check=True)
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


def shard_table(x, *, show_ids: bool = True, title: str | None = None) -> Rendered:
    """Every device's shard of ``x``: its device id, mesh position, index and actual values.

    Devices holding the same slice share a colour, so replication is visible at a glance.
    """
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
            head = f"<b>device {device.id}</b>" if show_ids else "<b>device</b>"
            bg = colour[_index_key(shard.index, x.shape)]
            cells.append(
                f"<div class='bk-dev' style='background:{bg}'>{head} "
                f"<span class='bk-idx'>x{html.escape(where)}</span>{_block_html(values)}</div>"
            )
            label = f"device {device.id}" if show_ids else "device"
            lines.append(f"{label} x{where}:\n{_block_text(values)}")
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
    n = len(labels)
    groups = list(range(n)) if groups is None else list(groups)
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
