"""How the book shows things: tables, errors, listings, pictures of arrays and diagrams.

Analysis modules (``book.shards``, ``book.hlo``, ``book.strategies``) return plain data; this
module is the one place that turns it into HTML for notebooks and the online book, each with a
plain-text twin for terminals. Every output embeds the book's one stylesheet once: ``book.css``,
shipped inside the package (a notebook in Colab has no repository) and linked from ``_static/``
for the online book. Diagrams are built with the ``graphviz`` package and drawn by Graphviz's
``dot``/``neato``; where those are missing a diagram shows as compact text, with one line saying
how to get the pictures. Text tables are laid out by ``tabulate``.
"""

from __future__ import annotations

import functools
import html
import importlib.resources
import math
import re
import textwrap

import graphviz
import numpy as np
from tabulate import tabulate

from book import hlo, shards, validate
from book.errors import ReaderError

STYLESHEET = importlib.resources.files("book").joinpath("book.css").read_text(encoding="utf-8")
# The colours that tell devices apart, read from the stylesheet so tables and diagrams agree.
PALETTE = tuple(re.findall(r"\.bk-c\d+ \{ background: (#[0-9a-f]{6}); \}", STYLESHEET))
NEEDS_DOT = (
    "(Pictures need Graphviz's dot: 'apt-get install graphviz' or 'brew install graphviz'; "
    "shown as text meanwhile.)"
)
MAX_ROWS, MAX_COLS, MAX_SLICES = 8, 8, 4
MAX_BLOCKS = shards.MAX_BLOCKS


class DisplayError(ReaderError, ValueError):
    """Something passed to a table or picture that it cannot show, explained in one sentence."""


@validate.impostors_refused
def styled(body: str) -> str:
    """HTML that carries the book's stylesheet: the one place an output embeds it."""
    if not isinstance(body, str):
        raise DisplayError(f"body must be HTML text, not {validate.describe(body)}.")
    return f"<style>{STYLESHEET}</style>" + validate.plain(body)


class Rendered:
    """HTML for notebooks, with a plain-text twin for terminals and text-only outputs.

    ``html`` is the bare markup, for composing several into one output; the notebook view adds
    the stylesheet.
    """

    def __init__(self, html_text: str, text: str):
        self.html = html_text
        self.text = text

    def _repr_html_(self):
        return styled(self.html)

    def __repr__(self):
        return self.text


class Diagram:
    """A Graphviz drawing: SVG in notebooks where Graphviz is installed, its text twin otherwise."""

    def __init__(self, graph: graphviz.Digraph, text: str):
        self.graph = graph
        self.text = text

    @property
    def source(self) -> str:
        return self.graph.source

    @functools.cached_property
    def svg(self) -> str | None:
        """The drawing as SVG, or None where Graphviz cannot draw it."""
        pinned = 2 if self.graph.engine == "neato" else None  # node positions are given
        try:
            return self.graph.pipe(format="svg", encoding="utf-8", neato_no_op=pinned)
        except (graphviz.ExecutableNotFound, graphviz.CalledProcessError):
            return None

    def _repr_mimebundle_(self, include=None, exclude=None):
        if self.svg is None:
            return {"text/plain": f"{self.text}\n{NEEDS_DOT}"}
        return {"image/svg+xml": self.svg, "text/plain": self.text}

    def __repr__(self):
        return self.text


def _digraph(name: str, engine: str, title: str | None, **node) -> graphviz.Digraph:
    graph = graphviz.Digraph(
        name,
        engine=engine,
        graph_attr={"fontname": "Helvetica"},
        node_attr={"shape": "box", "fontname": "Helvetica", **node},
        edge_attr={"fontname": "Helvetica"},
    )
    if title:
        graph.attr(label=_label(title), labelloc="t")
    return graph


def _label(text: str) -> str:
    """A Graphviz label: quoted even when it looks like markup (``<b>x</b>``), line breaks
    become Graphviz's own, and a lone surrogate its escape."""
    return graphviz.nohtml(_sendable(text).replace("\\", "\\\\").replace("\n", "\\n"))


def _title(title):
    return validate.optional_text(title, "the title", example="'x'", error=DisplayError)


# Tables and errors -------------------------------------------------------------------------------


MAX_TABLE_ROWS = 10_000  # more than any page can show


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_blank(v) -> bool:
    """An empty cell: the text ``''`` (compared as text, so no cell's own ``==`` is called)."""
    return isinstance(v, str) and str.__str__(v) == ""


def _cell(v) -> str:
    """A cell as text: whole numbers with thousands separators, never an error of its own."""
    if _is_number(v) and isinstance(v, int):
        return f"{v:,}" if v.bit_length() <= 1000 else validate.describe(v)
    try:
        return _sendable(str(v))
    except Exception:  # noqa: BLE001 - an object whose str fails is named by its type
        return validate.kind(v)


def _sendable(text: str) -> str:
    """``text`` with each lone surrogate written as its escape (``\\ud800``): the notebook
    sends outputs as UTF-8, which has no such character, and would fail on it."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _sequence(value, what: str, example: str) -> list:
    """A list or tuple (or an array, or rows made on the fly), never a text or a mapping.

    A string would be taken one character at a time, a dict by its keys, so both are refused,
    and so is a class such as ``list``, which has ``__iter__`` but no items.
    """
    import jax

    value = validate.plain(value)
    if isinstance(value, jax.Array):  # one deleted, or of keys, has no values to show
        validate.array(value, what, error=DisplayError)
    if (
        isinstance(value, (str, bytes, dict, set, type))
        or not hasattr(value, "__iter__")
        or getattr(value, "ndim", 1) == 0
    ):
        raise DisplayError(
            f"{what} must be a list, such as {example}, not {validate.describe(value)}."
        )
    items = []
    for item in value:
        items.append(item)
        if len(items) > MAX_TABLE_ROWS:
            raise DisplayError(f"{what} has more than {MAX_TABLE_ROWS:,} entries; show fewer.")
    return items


@validate.impostors_refused
def table(headers, rows, *, title: str | None = None, note: str | None = None) -> Rendered:
    """A small table, HTML with a plain-text twin, for facts read from programs and runs.

    Numbers are right-aligned and written with thousands separators. ``note`` is a footnote
    printed under the table, for what a row cannot say by itself. Headers and rows are lists
    (a text or a dict in their place is refused, not shown one character or key at a time),
    each row with one cell per header.
    """
    headers = [_cell(h) for h in _sequence(headers, "headers", "['op', 'bytes']")]
    if not headers:
        raise DisplayError("The table has no headers; give one for each column, such as ['op'].")
    rows = [
        _sequence(row, f"Row {k} of the table", "['all-gather', 1024]")
        for k, row in enumerate(_sequence(rows, "rows", "[['all-gather', 1024]]"))
    ]
    for k, row in enumerate(rows):
        if len(row) != len(headers):
            raise DisplayError(
                f"Row {k} of the table has {len(row)} cells but there are {len(headers)} "
                "headers; give every row one cell per header."
            )
    title = validate.optional_text(title, "the title", example="'x'", error=DisplayError)
    if note is not None:
        note = validate.text(note, "the note", example="'x'", limit=2000, error=DisplayError)
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [
        all(_is_number(v) or _is_blank(v) for v in column) and any(_is_number(v) for v in column)
        for column in zip(*rows, strict=True)
    ] or [False] * len(headers)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = ""
    for row, texts in zip(rows, cells, strict=True):
        tds = [
            f"<td class='num'>{html.escape(c)}</td>"
            if _is_number(v)
            else f"<td>{html.escape(c)}</td>"
            for v, c in zip(row, texts, strict=True)
        ]
        body += "<tr>" + "".join(tds) + "</tr>"
    caption = f"<caption>{html.escape(title)}</caption>" if title else ""
    markup = (
        f"<div class='bk-table-wrap'><table class='bk-table'>{caption}"
        f"<tr>{head}</tr>{body}</table></div>"
    )
    if note:
        markup += f"<p class='bk-note'>{html.escape(note)}</p>"
    align = ["right" if n else "left" for n in numeric]
    text = tabulate(cells, headers, tablefmt="simple", colalign=align, disable_numparse=True)
    return Rendered(
        markup, "\n".join(([title] if title else []) + [text] + ([note] if note else []))
    )


@validate.impostors_refused
def error_html(message) -> str:
    """A reader's mistake as its one sentence, in place of a result (bare markup)."""
    message = message if isinstance(message, str) else validate.describe(message)
    return f"<div class='bk-viz bk-error'>{html.escape(_sendable(message))}</div>"


# What the compiler made -------------------------------------------------------------------------


@validate.impostors_refused
def verdict_html(ok: bool, message: str, judged: bool = True) -> str:
    """An exercise checker's verdict: a mark, and its sentence."""
    ok = validate.flag(ok, "ok", error=DisplayError)
    judged = validate.flag(judged, "judged", error=DisplayError)
    message = validate.text(
        message, "the message", example="'x'", limit=4000, empty=True, error=DisplayError
    )
    kind, mark = ("bk-pass", "✔") if ok else ("bk-fail", "✘")
    if not judged:
        kind, mark = "bk-unjudged", "?"
    return styled(f"<div class='bk-verdict {kind}'><b>{mark}</b> {html.escape(message)}</div>")


@validate.impostors_refused
def outputs_html(texts) -> str:
    """What several processes printed, side by side, long lines wrapped inside their column."""
    texts = _sequence(texts, "texts", "['process 0 says', 'process 1 says']")
    if not texts or not all(isinstance(t, str) for t in texts):
        raise DisplayError(
            "texts must be a list of what each process printed, one text each, not "
            f"{validate.describe(texts)}."
        )
    columns = "".join(
        f"<div class='bk-process'><div class='bk-process-title'>process {i}</div>"
        f"<pre>{html.escape(_sendable(text.rstrip())) or '(no output)'}</pre></div>"
        for i, text in enumerate(texts)
    )
    grid = f"grid-template-columns:repeat({len(texts)},minmax(0,1fr))"
    return styled(f"<div class='bk-processes' style='{grid}'>{columns}</div>")


def _row(row, what: str = "a row") -> hlo.Collective:
    if not isinstance(row, hlo.Collective):
        raise DisplayError(
            f"Pass {what} of book.hlo.collectives(compiled), not {validate.describe(row)}."
        )
    return row


def _width(width) -> int:
    return validate.whole(width, "width", low=20, high=10_000, example=88, error=DisplayError)


@validate.impostors_refused
def shape_text(row: hlo.Collective) -> str:
    """A row's shapes per device: ``[8, 32]``, ``4 × [1, 4, 8]`` or ``([8], [8, 32])``."""
    _row(row)
    if len(row.shapes) == 1:
        return str(list(row.shapes[0]))
    if len(set(row.shapes)) == 1:
        return f"{len(row.shapes)} × {list(row.shapes[0])}"
    return "(" + ", ".join(str(list(s)) for s in row.shapes) + ")"


@validate.impostors_refused
def groups_text(row: hlo.Collective, limit: int = 4) -> str:
    """The groups of a row in a few characters: ``{0,4} {1,5} … (4 groups of 2)``."""
    _row(row)
    limit = validate.whole(limit, "limit", high=10_000, example=4, error=DisplayError)
    if row.op == "collective-permute":
        pairs = [f"{a}→{b}" for a, b in row.groups]
        shown = ", ".join(pairs[: 2 * limit])
        return shown + (f", … ({len(pairs)} pairs)" if len(pairs) > 2 * limit else "")
    parts = ["{" + ",".join(map(str, g)) + "}" for g in row.groups]
    shown = " ".join(parts[:limit])
    if len(parts) > limit:
        shown += " …"
    return f"{shown} ({len(parts)} group{'s' if len(parts) > 1 else ''} of {row.group_size})"


@validate.impostors_refused
def collective_table(compiled, *, title: str | None = None) -> Rendered:
    """The collectives of a compiled program as a table: op, shape, dtype, bytes, groups."""
    rows = hlo.collectives(compiled)
    if not rows:
        message = "No collectives: every device computes on the data it already holds."
        text = f"{title}: {message}" if title else message
        return Rendered(f"<p class='bk-table'>{html.escape(text)}</p>", text)
    body = [[k, r.op, shape_text(r), r.dtype, r.bytes, groups_text(r)] for k, r in enumerate(rows)]
    body.append(["", "total of results", "", "", sum(r.bytes for r in rows), ""])
    # Each collective's result on one device, not what it sends (book.cost.ring_bytes).
    headers = ["#", "collective", "shape per device", "dtype", "result bytes per device", "groups"]
    return table(headers, body, title=title)


_NODE_STYLES = {
    "collective": {
        "style": "filled,bold",
        "fillcolor": "#f4cccc",
        "color": "#cc0000",
        "penwidth": "2",
    },
    "fusion": {"style": "filled,rounded", "fillcolor": "#fff2cc", "color": "#b7950b"},
    "parameter": {
        "shape": "ellipse",
        "style": "filled",
        "fillcolor": "#cfe2f3",
        "color": "#3d85c6",
    },
    "other": {"style": "rounded", "color": "#666666"},
}


def _node_label(node: hlo.Node) -> str:
    if node.kind == "collective":
        row = node.collective
        label = f"{node.what}\n{node.type}\n{row.bytes:,} B\n{groups_text(row, 2)}"
    elif node.kind == "fusion":
        label = f"fusion: {node.what}\n{node.type}"
    else:
        label = f"{node.what}\n{node.type}"
    return f"{node.count} × {label}" if node.count > 1 else label


@validate.impostors_refused
def hlo_graph(compiled, *, title: str | None = None) -> Diagram:
    """The entry computation of a compiled program as a data-flow graph (``hlo.dataflow``).

    Collectives are red and carry their bytes and groups, fusions are yellow and name what
    they merge, parameters are blue and named after the function's arguments.
    """
    flow, title = hlo.dataflow(compiled), _title(title)
    graph = _digraph("hlo", "dot", title, fontsize="11")
    graph.attr("edge", color="#555555")
    lines = [title] if title else []
    for k, node in enumerate(flow.nodes):
        label = _node_label(node)
        graph.node(f"n{k}", _label(label), **_NODE_STYLES[node.kind])
        for s in node.inputs:
            graph.edge(f"n{s}", f"n{k}")
        given = ", ".join(f"[{s}]" for s in node.inputs)
        line = f"[{k}] " + label.replace("\n", " ")
        lines.append(line + (f"  <- {given}" if given else ""))
    graph.node("out", "output", shape="plaintext")
    for s in flow.outputs:
        graph.edge(f"n{s}", "out")
    return Diagram(graph, "\n".join(lines))


@validate.impostors_refused
def instruction_text(row: hlo.Instruction, width: int = 88) -> str:
    """One instruction on one line, each attribute that says where data lives indented below."""
    if not isinstance(row, hlo.Instruction):
        raise DisplayError(
            f"Pass a row of book.hlo.instructions(compiled), not {validate.describe(row)}."
        )
    width = _width(width)
    root = "ROOT " if row.root else ""
    lines = [f"{root}%{row.name} = {row.type} {row.op}({', '.join(row.operands)})"]
    if row.fused:
        verb = "runs" if row.op in ("while", "call", "conditional") else "fuses"
        lines.append(f"    {verb} " + ", ".join(row.main_fused))
    lines += [f"    {d}" for d in row.details]
    return "\n".join(_wrap(line, width) for line in lines)


@validate.impostors_refused
def listing(compiled, *, ops=None, width: int = 88) -> str:
    """The entry computation of a compiled program as short text, one instruction at a time.

    ``.as_text()`` puts layouts, metadata and backend configuration on every line, which hides
    what a reader looks for: each result's shape on one device and the collectives' groups (and
    the parameters' shardings, where the XLA version prints them: jax 0.10's does, 0.12's leaves
    them out, and ``compiled.input_shardings`` has them in every version). Here each
    instruction is one line (its name, result type, op and operands), a fusion says which
    operations it merges, and only the attributes of ``hlo.Instruction.details`` follow,
    indented. With ``ops``, only instructions doing one of them are listed.
    """
    width = _width(width)
    rows = hlo.instructions(compiled)
    if ops is not None:
        wanted = validate.plain(ops)
        wanted = [wanted] if isinstance(wanted, str) else wanted
        if isinstance(wanted, (list, tuple, set)):
            wanted = [validate.plain(op) for op in wanted]
        if not isinstance(wanted, list) or not all(isinstance(op, str) for op in wanted):
            raise DisplayError(
                f"ops must be an op or a list of ops, such as ['all-gather', 'dot'], not "
                f"{validate.describe(ops)}."
            )
        for op in wanted:  # a name HLO does not have is refused, not matched by nothing
            hlo.instructions(compiled, op)
        rows = [r for r in rows if any(r.does(op) for op in wanted)]
    return "\n".join(instruction_text(r, width) for r in rows)


@validate.impostors_refused
def stablehlo_listing(lowered, *, width: int = 88) -> str:
    """The ``main`` function of a lowered program (``hlo.stablehlo_main``) as short text.

    One argument per line with the sharding it carries, then one operation per line.
    """
    width = _width(width)
    main = hlo.stablehlo_main(lowered)
    args = [f"    {a}," for a in main.arguments]
    if args:
        args[-1] = args[-1][:-1]
    lines = ["@main(", *args, f") -> {', '.join(main.results)}", *main.operations]
    return "\n".join(_wrap(line, width) for line in lines)


def _wrap(line: str, width: int) -> str:
    if len(line) <= width:
        return line
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return textwrap.fill(
        line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


# Pictures of sharded arrays ----------------------------------------------------------------------


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


def _box(content: str, colour: int | None = None) -> str:
    """One device's box; ``colour`` picks the stylesheet's colour ``bk-c<n>``."""
    tint = "" if colour is None else f" bk-c{colour % len(PALETTE)}"
    return f"<div class='bk-dev{tint}'>{content}</div>"


def _grid(rows: list[list[str]]) -> str:
    return (
        "<table class='bk-grid'>"
        + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
        + "</table>"
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


@validate.impostors_refused
def mesh_text(shape) -> str:
    """A mesh's shape in prose, with its article: 'a 2x4 mesh', 'an 8-device mesh'."""
    shape = validate.sizes(shape, "The mesh's shape", error=DisplayError)
    if not shape:
        raise DisplayError("The mesh's shape is empty; give one size per axis, such as (2, 4).")
    words = f"{shape[0]}-device" if len(shape) == 1 else "x".join(map(str, shape))
    # 'an' before the numbers said with a vowel first: eight, eighty, eight hundred, eleven,
    # eighteen, and those thousands or millions of them. The leading group of three digits
    # is what is said first (11,000: eleven thousand; 110: a hundred and ten).
    first = str(shape[0])
    lead = first[: len(first) % 3 or 3]
    article = "an" if lead.startswith("8") or lead in ("11", "18") else "a"
    return f"{article} {words} mesh"


@validate.impostors_refused
def shard_table(x, *, show_ids: bool = True, title: str | None = None, name: str = "x") -> Rendered:
    """Every device's shard of ``x``: its device id, mesh position, index and actual values.

    Devices holding the same slice share a colour, so replication is visible at a glance.
    ``name`` labels each index (``w1[0:2, :]``), so tables of several arrays tell them apart.
    """
    validate.array(x, "shard_table's argument")
    show_ids = validate.flag(show_ids, "show_ids", error=DisplayError)
    title = _title(title)
    name = validate.text(name, "the name", example="'x'", limit=40, error=DisplayError)
    if len(x.sharding.device_set) > MAX_BLOCKS:
        raise DisplayError(
            f"The array spans {len(x.sharding.device_set)} devices; a table shows at most "
            f"{MAX_BLOCKS}."
        )
    grid, names, mesh_shape = _device_grid(x)
    by_device = {s.device: s for s in x.addressable_shards}
    keys = sorted({shards.index_key(s.index, x.shape) for s in by_device.values()})
    colour = {k: i for i, k in enumerate(keys)}
    rows, lines = [], []
    for r in range(grid.shape[0]):
        rows.append([])
        for device in grid[r]:
            shard = by_device.get(device)
            if shard is None:
                rows[-1].append(_box("not addressable here"))
                continue
            values = np.asarray(shard.data)
            where = _slice_text(shard.index, x.shape)
            head = f"<b>device {device.id}</b>" if show_ids else "<b>device</b>"
            content = f"{head} <span class='bk-idx'>{html.escape(name + where)}</span>"
            tint = colour[shards.index_key(shard.index, x.shape)]
            rows[-1].append(_box(content + _block_html(values), tint))
            label = f"device {device.id}" if show_ids else "device"
            lines.append(f"{label} {name}{where}:\n{_block_text(values)}")
    s = shards.summarize(x)
    mesh_note = ""
    if mesh_shape is not None:
        mesh_note = f" on {mesh_text(mesh_shape)} {tuple(n for n in names if n)}"
    summary = (
        f"array {s.shape} {s.dtype}{mesh_note}: shard shape {s.shard_shape}, "
        f"{s.bytes_per_device:,} of {s.total_bytes:,} bytes per device, "
        f"each shard held by {s.replication} device{'s' if s.replication > 1 else ''}"
    )
    return _grid_with_summary(title, rows, lines, summary)


def _grid_with_summary(title, rows, lines: list[str], summary: str) -> Rendered:
    """A titled grid of device boxes with a summary line under it, and its text twin."""
    heading = f"<div><b>{html.escape(title)}</b></div>" if title else ""
    body = (
        f"<div class='bk-viz'>{heading}{_grid(rows)}"
        f"<div class='bk-sum'>{html.escape(summary)}</div></div>"
    )
    return Rendered(body, "\n".join(([title] if title else []) + lines + [summary]))


@validate.impostors_refused
def mesh_diagram(mesh, *, title: str | None = None) -> Diagram:
    """The mesh as a grid of device ids at their mesh coordinates: device order made visible.

    Each box shows a device id and, below it, the device's coordinates along the mesh axes.
    """
    validate.mesh(mesh)
    title = _title(title)
    if not mesh.axis_names:  # JAX takes Mesh(np.array(device), ()): one device, no axis
        raise DisplayError(
            "The mesh has no axes, so there is no grid to draw; give it one, such as "
            "jax.make_mesh((1,), ('x',))."
        )
    if mesh.size > MAX_BLOCKS:
        raise DisplayError(
            f"The mesh has {mesh.size} devices; a diagram shows at most {MAX_BLOCKS}."
        )
    devices = np.asarray(mesh.devices)
    names = tuple(mesh.axis_names)
    grid = devices.reshape(1, -1) if devices.ndim == 1 else devices.reshape(devices.shape[0], -1)
    graph = _digraph("mesh", "neato", title, style="rounded,filled")
    step_x, step_y = 90, 60
    for pos, device in np.ndenumerate(devices):
        r, c = np.argwhere(grid == device)[0]
        coord = "(" + ", ".join(map(str, pos)) + ")"
        graph.node(
            f"d{device.id}",
            f'<<b>{device.id}</b><br/><font point-size="9">{coord}</font>>',
            fillcolor=PALETTE[device.id % len(PALETTE)],
            pos=f"{c * step_x},{-r * step_y}",
        )
    cols_name = names[-1] if devices.ndim <= 2 else "(" + ", ".join(names[1:]) + ")"
    plain = {"shape": "plaintext", "style": ""}
    graph.node(
        "cols",
        _label(cols_name + " →"),
        pos=f"{(grid.shape[1] - 1) * step_x / 2},{step_y * 0.8}",
        **plain,
    )
    if devices.ndim > 1:
        graph.node(
            "rows",
            _label(names[0] + " ↓"),
            pos=f"{-step_x * 0.9},{-(grid.shape[0] - 1) * step_y / 2}",
            **plain,
        )
    shape = "x".join(map(str, devices.shape))
    heading = f"{title or shape + ' mesh'} {names}, device ids:"
    planes = [("", grid)]
    if devices.ndim > 2:  # one 2D slice per position along the leading axes, labelled
        planes = [
            (", ".join(f"{a}={i}" for a, i in zip(names, lead)) + ":", devices[lead])
            for lead in np.ndindex(devices.shape[:-2])
        ]
    text_rows = []
    for label, plane in planes:
        text_rows += [label] if label else []
        text_rows += ["  ".join(f"{d.id:>2}" for d in row) for row in plane]
    return Diagram(graph, "\n".join([heading, *text_rows]))


@validate.impostors_refused
def ring_diagram(labels, groups=None, *, title: str | None = None) -> Diagram:
    """Nodes around a circle, joined in the given order: a ring of devices as data travels it.

    ``labels`` are in ring order; ``groups`` (same length) colours nodes that share a chip.
    """
    labels = _labels(labels)
    n = len(labels)
    title = _title(title)
    groups = validate.plain(groups)
    if groups is not None and (
        not isinstance(groups, (list, tuple, np.ndarray))
        or getattr(groups, "ndim", 1) == 0
        or len(groups) != n
    ):
        raise DisplayError(
            f"groups must be a list with one entry per label ({n}), not "
            f"{validate.describe(groups)}."
        )
    groups = list(range(n)) if groups is None else [_group_key(g) for g in groups]
    colours = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(dict.fromkeys(groups))}
    radius = 40 + 22 * n
    graph = _digraph("ring", "neato", title, style="rounded,filled")
    for k, (label, group) in enumerate(zip(labels, groups)):
        angle = math.pi / 2 - 2 * math.pi * k / n
        x, y = radius * math.cos(angle), radius * math.sin(angle)
        graph.node(f"n{k}", _label(label), fillcolor=colours[group], pos=f"{x:.0f},{y:.0f}")
    for k in range(n):
        graph.edge(f"n{k}", f"n{(k + 1) % n}")
    flat = [label.replace("\n", ", ") for label in labels]  # one line of text for the ring
    text = (f"{title}: " if title else "") + " -> ".join(flat) + f" -> {flat[0]}"
    return Diagram(graph, text)


def _labels(labels) -> list[str]:
    """Node labels: a non-empty list or tuple of short texts or numbers."""
    if isinstance(labels, np.ndarray):  # sized first: a broadcast view may stand for 10**12
        if labels.size > MAX_BLOCKS:
            raise DisplayError(
                f"There are {labels.size:,} labels; a diagram shows at most {MAX_BLOCKS}."
            )
        labels = labels.tolist()
    labels = validate.plain(labels)
    if not isinstance(labels, (list, tuple)) or not labels:
        raise DisplayError(
            f"labels must be a non-empty list of texts or numbers, not {validate.describe(labels)}."
        )
    if len(labels) > MAX_BLOCKS:
        raise DisplayError(f"There are {len(labels)} labels; a diagram shows at most {MAX_BLOCKS}.")
    out = []
    for label in labels:
        if isinstance(label, (str, int, float, np.integer, np.floating)) and not isinstance(
            label, bool
        ):
            shown = validate.plain(label) if isinstance(label, str) else validate.describe(label)
            out.append(_sendable(shown[:60]))
        else:
            raise DisplayError(
                f"Each label must be a text or a number, not {validate.describe(label)}."
            )
    return out


def _group_key(group):
    """A group as a key (a number, a text or a chip's coordinates), read as the value it holds."""
    group = validate.plain(validate.scalar(group))
    try:
        hash(group)
    except Exception:  # noqa: BLE001 - unhashable, or a hash of the reader's own that fails
        raise DisplayError(
            f"Each group must be a number or a text naming it, not {validate.describe(group)}."
        ) from None
    return group


# Collectives: what each device holds before and after, and where every value went --------------

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


def _inline_text(values: np.ndarray, max_rows: int = 4) -> str:
    """A block in a few short lines, for diagram nodes."""
    values = np.asarray(values)
    if values.ndim == 0:
        return _fmt(values[()])
    if values.size == 0:
        return f"[] {'×'.join(map(str, values.shape))}"
    rows = values.reshape(-1, values.shape[-1]) if values.ndim > 1 else values[None]
    lines = []
    for row in rows[:max_rows]:
        cells = [_fmt(v) for v in row[:MAX_COLS]] + (["…"] if row.size > MAX_COLS else [])
        lines.append("[" + " ".join(cells) + "]")
    if rows.shape[0] > max_rows:
        lines.append(f"⋮ {'×'.join(map(str, values.shape))}")
    return "\n".join(lines)


@validate.impostors_refused
def before_after_table(
    before, after, *, title: str | None = None, headers: tuple[str, str] = ("before", "after")
) -> Rendered:
    """One row per device: the block it held before a collective and the block it holds after.

    ``before`` and ``after`` are ``jax.Array``s (read with ``shards.device_blocks``) or
    per-device lists, in the same device order. Each device keeps its colour in both columns.
    """
    before = shards.blocks(before, "before_after_table's before")
    after = shards.blocks(after, "before_after_table's after")
    title = _title(title)
    headers = validate.plain(headers)
    if (
        not isinstance(headers, (tuple, list))
        or len(headers) != 2
        or not all(isinstance(h, str) for h in headers)
    ):
        raise DisplayError(
            f"headers must be two texts, such as ('before', 'after'), not "
            f"{validate.describe(headers)}."
        )
    if len(before) != len(after):
        raise DisplayError(
            f"{len(before)} blocks before but {len(after)} after; pass one per device."
        )
    rows = [[f"<b>{html.escape(_sendable(h))}</b>" for h in ("device",) + tuple(headers)]]
    lines = []
    for k, ((label, b), (_, a)) in enumerate(zip(before, after)):
        rows.append(
            [
                _box(f"<b>{html.escape(_sendable(label))}</b>", k),
                _box(_block_html(b), k),
                _box(_block_html(a)),
            ]
        )
        lines.append(f"{label}: {_inline_text(b)} -> {_inline_text(a)}".replace("\n", " "))
    b0, a0 = before[0][1], after[0][1]
    summary = (
        f"each device: {headers[0]} {tuple(b0.shape)} {b0.dtype}, "
        f"{headers[1]} {tuple(a0.shape)} {a0.dtype}"
    )
    return _grid_with_summary(title, rows, lines, summary)


def _reduced_parts(before, after, reduce, groups):
    """For each device, the group it reduces with and what it keeps of the group's result."""
    symbol, fn = _REDUCTIONS[reduce]
    parts = {}
    for g, members in enumerate(groups):
        shapes = {before[k][1].shape for k in members}
        if len(shapes) > 1:
            raise DisplayError(
                f"The inputs reduced together have shapes {sorted(shapes)}; give the devices "
                "of a group blocks of one shape."
            )
        totals = _group_results(np.stack([before[k][1] for k in members]), fn)
        for rank, d in enumerate(members):
            a = after[d][1]
            parts[d] = next(
                (
                    (g, total, kept)
                    for total in totals  # the first way of adding that gives what d holds
                    for kept, piece in _kept_parts(total, len(members), rank)
                    if piece.size == a.size and _near(a, piece.reshape(a.shape), len(members))
                ),
                None,
            )
            if parts[d] is None:
                raise DisplayError(
                    f"{after[d][0]} holds {_inline_text(a)!r}, which is neither the {reduce} of "
                    "its group's inputs nor an even part of it."
                )
    return symbol, parts


def _kept_parts(total: np.ndarray, n: int, rank: int):
    """What a device of rank ``rank`` among ``n`` may keep of a group's result: all of it, or
    its even part along one dimension."""
    yield "all", total
    for dim in range(total.ndim):
        if total.shape[dim] % n == 0:
            yield f"part {rank} of dim {dim}", np.split(total, n, axis=dim)[rank]


def _group_results(stack: np.ndarray, fn) -> list[np.ndarray]:
    """A group's reduction as a collective may compute it, in the blocks' type: added in a
    wider type and rounded (as XLA's CPU all-reduce does for bfloat16), or added in the
    blocks' own type, which can wrap (integers) or overflow (float16)."""
    wide = validate.widened(stack)
    if np.issubdtype(wide.dtype, np.integer) or wide.dtype == bool:
        wide = wide.astype(np.int64)
    elif not np.issubdtype(wide.dtype, np.complexfloating):
        wide = wide.astype(np.float64)
    with np.errstate(all="ignore"):
        exact = np.asarray(fn(wide, axis=0))  # also as JAX gives an int mean or a bool sum
        found = [exact.astype(stack.dtype), exact]
        try:
            found.append(np.asarray(fn(stack, axis=0, dtype=stack.dtype)))
        except (TypeError, ValueError):  # a type NumPy cannot add in
            pass
    return found


def _near(a: np.ndarray, b: np.ndarray, n: int) -> bool:
    """Equal, nan for nan, to what adding n blocks in another order can change: nothing for
    integers, a few units in the last place of the type for floats."""
    a, b = validate.widened(a), validate.widened(b)
    if np.issubdtype(a.dtype, np.integer) or a.dtype == bool:
        return bool(np.array_equal(a, b))
    given = np.dtype(validate.widened(np.zeros(0, a.dtype)).dtype)
    eps = float(np.finfo(given).eps) if given.kind in "fc" else 0.0
    with np.errstate(all="ignore"):
        return bool(np.allclose(a, b, rtol=max(1e-5, 2 * n * eps), atol=1e-8, equal_nan=True))


def _positions(groups, n) -> list[list[int]]:
    """Groups of device positions that together cover each of the ``n`` positions once."""
    message = (
        f"groups must be lists of device positions 0 to {n - 1}, each position in one group, "
        f"such as [[0, 1], [2, 3]], not {validate.describe(groups)}."
    )
    groups = validate.plain(groups)
    if not isinstance(groups, (list, tuple)) or not groups:
        raise DisplayError(message)
    out = []
    for group in groups:
        group = validate.plain(group)
        if not isinstance(group, (list, tuple)) or not group:
            raise DisplayError(message)
        out.append(
            [validate.whole(p, "A position", low=0, high=n - 1, error=DisplayError) for p in group]
        )
    if sorted(p for g in out for p in g) != list(range(n)):
        raise DisplayError(message)
    return out


@validate.impostors_refused
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
    ``shards.trace_moves``), and each arrow carries the values it moved, coloured by the
    sender. With ``reduce="sum"`` or ``"mean"`` the inputs meet in one node per group
    (``groups``: lists of device positions reduced together; default all) and each arrow out
    says what its device kept, checked against the actual values.
    """
    before = shards.blocks(before, "collective_diagram's before")
    after = shards.blocks(after, "collective_diagram's after")
    n = len(before)
    if len(after) != n:
        raise DisplayError(f"{n} blocks before but {len(after)} after; pass one per device.")
    title = _title(title)
    if label_edges is not None:
        label_edges = validate.flag(label_edges, "label_edges", error=DisplayError)
    groups = [list(range(n))] if groups is None else _positions(groups, n)
    if reduce is not None:
        reduce = validate.choice(reduce, list(_REDUCTIONS), "a reduction", error=DisplayError)
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
    graph = _digraph("collective", "neato", title, style="rounded,filled", fontsize="10")
    graph.attr("edge", fontsize="9", arrowsize="0.6")
    for k, text in enumerate(labels_b):
        fill = PALETTE[k % len(PALETTE)]
        graph.node(f"b{k}", _label(text), fillcolor=fill, pos=f"0,{-k * step_y}")
    for k, text in enumerate(labels_a):
        graph.node(f"a{k}", _label(text), fillcolor="white", pos=f"{x_after:.0f},{-k * step_y}")
    for name, x in (("before", 0), ("after", x_after)):
        graph.node(
            f"h_{name}",
            name,
            shape="plaintext",
            style="",
            fontsize="12",
            pos=f"{x:.0f},{step_y * 0.8:.0f}",
        )
    text = [title] if title else []
    if reduce is None:
        moves, zeros = shards.trace_moves(before, after)
        show = label_edges if label_edges is not None else len(moves) <= 2 * n
        sent = {}  # (sender, values moved): the receivers, so that a broadcast takes one line
        for (s, d), values in sorted(moves.items()):
            colour = _EDGE_COLOURS[s % len(_EDGE_COLOURS)]
            moved = " ".join(_fmt(v) for v in values[:6]) + (" …" if len(values) > 6 else "")
            label = {"label": moved} if show else {}
            graph.edge(f"b{s}", f"a{d}", color=colour, fontcolor=colour, **label)
            sent.setdefault((s, moved), []).append(d)
        lines = []
        for (s, moved), receivers in sent.items():
            to = ", ".join(after[d][0] for d in receivers)
            to = "every device" if len(receivers) == n > 1 else to
            lines.append(f"{before[s][0]} -> {to}: {moved}")
        if len(lines) > 2 * n:  # text can list a few moves; the values are in the tables
            lines = [*lines[: 2 * n], f"… and {len(lines) - 2 * n} more moves"]
        text += lines or ["no value moved: every block after is empty"] * (not zeros)
        for d in sorted(zeros):
            text.append(f"{after[d][0]}: zeros, nobody sent to it")
    else:
        for g, members in enumerate(groups):
            centre = -sum(members) * step_y / len(members)
            graph.node(
                f"r{g}", _label(hubs[g]), fillcolor="#eeeeee", pos=f"{x_hub:.0f},{centre:.0f}"
            )
            for s in members:
                graph.edge(f"b{s}", f"r{g}", color=_EDGE_COLOURS[s % len(_EDGE_COLOURS)])
            names = ", ".join(before[s][0] for s in members)
            text.append(f"{symbol} of {names} = " + hubs[g].split("\n", 1)[1].replace("\n", " "))
        for d in range(n):
            graph.edge(f"r{parts[d][0]}", f"a{d}")
            text.append(f"{after[d][0]} keeps {parts[d][2]}: {_inline_text(after[d][1])}")
    return Diagram(graph, "\n".join(text))


# The colour of each kind of instruction on a timeline: communication in colour, compute grey.
LEGEND_INCHES = 0.35  # the timeline's legend strip
MAX_TIMELINE_DEVICES = 256  # rows a timeline draws (a TPU v5e pod)
TIMELINE_COLOURS = {
    "compute": "#b7b7b7",
    "all-gather": "#3d85c6",
    "reduce-scatter": "#e69138",
    "all-reduce": "#6aa84f",
    "collective-permute": "#8e7cc3",
    "all-to-all": "#cc0000",
}


def _finite(value) -> bool:
    """A real number, not a flag, nan or an infinity (nor an integer past any float)."""
    value = validate.plain(value)
    number = isinstance(value, (int, float, np.integer, np.floating))
    try:
        return number and not isinstance(value, (bool, np.bool_)) and math.isfinite(value)
    except OverflowError:  # 10**400
        return False


@validate.impostors_refused
def timeline(ops, kinds, *, title: str | None = None):
    """A per-device timeline of one run of a program: a row per device, a bar per instruction.

    ``ops`` are ``book.trace.Op`` rows (one execution, every device); ``kinds`` maps an
    instruction's name to its kind of collective (from ``book.hlo.collectives``), and every
    other instruction is drawn as compute. Time runs in milliseconds from the run's first
    instruction. Returns the matplotlib figure.
    """
    import matplotlib.pyplot as plt

    from book.trace import Op

    ops = _sequence(ops, "ops", "trace.runs(program)[-1]")
    if not ops:
        raise DisplayError("There is nothing to draw: pass the ops of one run of a program.")
    if not all(isinstance(op, Op) for op in ops):
        odd = next(op for op in ops if not isinstance(op, Op))
        raise DisplayError(
            f"ops must be book.trace.Op rows, as Trace.runs gives them, not "
            f"{validate.describe(odd)}."
        )
    for op in ops:  # rows made by hand: a device number, a text name, finite microseconds
        device, name = validate.plain(op.device), validate.plain(op.name)
        if not (
            isinstance(device, (int, np.integer))
            and not isinstance(device, (bool, np.bool_))
            and device >= 0
            and isinstance(name, str)
            and _finite(op.start)
            and _finite(op.duration)
            and op.duration >= 0
        ):
            raise DisplayError(
                "Each Op needs a device number, a name and a start and duration in "
                f"microseconds, not {validate.describe(repr(op), 120)}."
            )
    given, kinds = kinds, validate.plain(kinds)
    if isinstance(kinds, dict):  # names and kinds as the texts they hold
        kinds = {validate.plain(k): validate.plain(v) for k, v in kinds.items()}
    if not isinstance(kinds, dict) or not all(isinstance(k, str) for k in kinds):
        raise DisplayError(
            "kinds must be a dict from an instruction's name to its collective, such as "
            f"{{'all-gather.1': 'all-gather'}}, not {validate.describe(given)}."
        )
    unknown = [k for k in kinds.values() if not isinstance(k, str) or k not in TIMELINE_COLOURS]
    if unknown:
        odd = validate.describe(unknown[0])
        raise DisplayError(
            f"{odd} is not a kind of collective the book draws; use one of "
            f"{', '.join(TIMELINE_COLOURS)}."
        )
    title = _title(title)
    # As plain Python numbers and texts: a NumPy int8 or float16 start would wrap or
    # overflow when the origin is subtracted in its own type.
    ops = [
        Op(int(op.device), validate.plain(op.name), "", float(op.start), float(op.duration))
        for op in ops
    ]
    devices = sorted({op.device for op in ops})
    if len(devices) > MAX_TIMELINE_DEVICES:
        raise DisplayError(
            f"The ops ran on {len(devices):,} devices, more rows than a timeline can show; "
            f"pass the ops of at most {MAX_TIMELINE_DEVICES} devices."
        )
    origin = min(op.start for op in ops)
    height = 0.35 * len(devices) + 1.4 + LEGEND_INCHES
    fig, ax = plt.subplots(figsize=(9, height))
    for row, device in enumerate(devices):
        by_kind: dict[str, list[tuple[float, float]]] = {}
        for op in ops:
            if op.device == device:
                span = ((op.start - origin) / 1e3, op.duration / 1e3)
                by_kind.setdefault(kinds.get(op.name, "compute"), []).append(span)
        for kind, spans in by_kind.items():
            ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=TIMELINE_COLOURS[kind])
    ax.set_yticks(range(len(devices)), [f"device {d}" for d in devices])
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds from the step's first instruction")
    shown = ["compute", *sorted(set(kinds.values()) & {kinds.get(op.name) for op in ops})]
    handles = [plt.Rectangle((0, 0), 1, 1, color=TIMELINE_COLOURS[k]) for k in shown]
    # In a strip of its own below the axis's label, which an axes' legend there would cover.
    fig.legend(handles, shown, loc="lower center", ncol=len(shown), frameon=False)
    if title:
        ax.set_title(title, parse_math=False)  # a "$" is a dollar, not mathematics
    fig.tight_layout(rect=(0, LEGEND_INCHES / height, 1, 1))
    return fig
