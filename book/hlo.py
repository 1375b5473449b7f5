"""What the compiler made: the collectives of a compiled computation, as rows, a table and a graph.

``jax.jit(f).lower(...).compile().as_text()`` is the partitioned HLO module every device runs.
Reading it is the only way to know which communication the compiler inserted, so this module
parses that text. XLA prints a collective's device groups in three notations, and which one a
collective gets depends on the collective and on the XLA version, so each is read here into the
same tuples of device positions: explicit lists (``{{0,1},{2,3}}``), iota tiles
(``[2,4]<=[8]``, ``[4,2]<=[2,4]T(1,0)``) and mesh axes (``mesh['data'=2,'model'=4] {'data'}``,
the axes named after the program's mesh or ``axis_0``, ``axis_1``..., with an optional
``device_ids=(...)``, sub-axes such as ``'model':(2)2`` and several axes in the order they
combine, ``{'model','data'}``). Group members are partition numbers: the positions of devices
in the compiled program's device assignment, which is the order of the mesh's devices
(``mesh.devices.flat``).
"""

from __future__ import annotations

import html
import math
import re
import textwrap
from dataclasses import dataclass

import numpy as np

from book import validate
from book.viz import Diagram, Rendered

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")

_DTYPE_NAMES = {
    "pred": "bool",
    "bf16": "bfloat16",
    "c64": "complex64",
    "c128": "complex128",
}
_INSTRUCTION = re.compile(
    r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.+?)\s+(?P<op>[a-z][\w\-]*)\("
)
_COMPUTATION = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")


@dataclass(frozen=True)
class Collective:
    """One collective in a compiled program.

    ``shape`` and ``dtype`` describe the result on one device; a collective that moves several
    arrays at once (a tuple result) has a tuple of shapes, and its dtypes joined by commas when
    they differ. ``bytes`` is the result's size on one device. ``groups`` are the device groups
    that communicate, or for a collective-permute the (source, target) pairs.
    """

    op: str
    shape: tuple
    dtype: str
    bytes: int
    groups: tuple[tuple[int, ...], ...]
    name: str = ""
    computation: str = ""

    @property
    def group_size(self) -> int:
        """How many devices take part in each group (2 for every collective-permute pair)."""
        return len(self.groups[0]) if self.groups else 0


@dataclass
class _Instruction:
    name: str
    type: str
    op: str
    operands: list[str]
    attrs: str
    root: bool
    computation: str


@dataclass
class _Module:
    computations: dict[str, list[_Instruction]]
    entry: str
    num_devices: int


def _text(compiled) -> str:
    validate.compiled(compiled)  # a function or a lowered program gets one sentence
    if isinstance(compiled, str):
        return compiled
    return compiled.as_text()


def _close(text: str, start: int) -> int:
    """Index just past the bracket that closes the one opening at ``start``."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    for i in range(start, len(text)):
        c = text[i]
        if c in pairs:
            stack.append(pairs[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
    return len(text)


def _split_top(text: str, opening: str = "([{", closing: str = ")]}") -> list[str]:
    """Split at commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += c in opening
        depth -= c in closing
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _parse(text: str) -> _Module:
    computations: dict[str, list[_Instruction]] = {}
    entry, current = "", None
    header = text.split("\n", 1)[0]
    partitions = re.search(r"num_partitions=(\d+)", header)
    replicas = re.search(r"replica_count=(\d+)", header)
    num_devices = int(partitions.group(1)) if partitions else 1
    num_devices *= int(replicas.group(1)) if replicas else 1
    for line in text.splitlines():
        if current is None:
            m = _COMPUTATION.match(line)
            if m and not line.startswith("HloModule"):
                current = m.group("name")
                computations[current] = []
                if m.group("entry"):
                    entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        open_at = m.end() - 1
        close_at = _close(line, open_at)
        operands = []
        for part in _split_top(line[open_at + 1 : close_at - 1]):
            part = re.sub(r"/\*.*?\*/", "", part).strip()
            if part:
                operands.append(part.split()[-1].lstrip("%"))
        computations[current].append(
            _Instruction(
                name=m.group("name"),
                type=m.group("type"),
                op=m.group("op"),
                operands=operands,
                attrs=line[close_at:],
                root=bool(m.group("root")),
                computation=current,
            )
        )
    if not computations:
        raise ValueError("No HLO computations found: pass a compiled program or its .as_text().")
    return _Module(computations, entry or list(computations)[-1], num_devices)


def _arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
    """The (element type, dimensions) of every array in an HLO type, tuples flattened."""
    found = []
    for elem, dims in _ARRAY.findall(type_text):
        if elem == "token":
            continue
        sizes = tuple(int(d.replace("<=", "")) for d in dims.split(",") if d.strip())
        found.append((elem, sizes))
    return found


def _bits(elem: str) -> int:
    if elem == "pred":
        return 8
    if elem in ("c64", "c128"):
        return int(elem[1:])
    m = re.match(r"(?:bf|[suf])(\d+)", elem)
    if m is None:
        raise ValueError(f"Unknown HLO element type {elem!r}.")
    return int(m.group(1))


def _dtype_name(elem: str) -> str:
    """numpy's name for an HLO element type (f32 -> float32), so rows compare with jnp dtypes."""
    if elem in _DTYPE_NAMES:
        return _DTYPE_NAMES[elem]
    m = re.fullmatch(r"([suf])(\d+)(.*)", elem)
    if m is None:
        return elem
    kind, bits, rest = m.groups()
    base = {"s": "int", "u": "uint", "f": "float"}[kind] + bits
    return f"{base}_{rest}" if rest else base


def _iota(dims, reshape, perm) -> np.ndarray:
    values = np.arange(math.prod(reshape)).reshape(reshape)
    if perm:
        values = values.transpose(perm)
    return values.reshape(dims)


def _ints(text: str) -> list[int]:
    return [int(v) for v in re.findall(r"-?\d+", text)]


def _explicit_groups(text: str) -> list[list[int]]:
    inner = text.strip()[1:-1]
    return [_ints(g) for g in re.findall(r"\{([^{}]*)\}", inner)]


def _mesh_devices(sizes: list[int], ids_text: str | None) -> np.ndarray:
    """The device array of a mesh: iota unless ``device_ids=`` gives an iota tile or a list."""
    if not ids_text:
        return np.arange(math.prod(sizes)).reshape(sizes)
    iota = re.fullmatch(r"\s*\[([\d,]+)\](?:T\(([\d,]+)\))?\s*", ids_text)
    if iota:
        return _iota(sizes, _ints(iota.group(1)), _ints(iota.group(2) or ""))
    return np.array(_ints(ids_text)).reshape(sizes)


def _mesh_groups(axes_text: str, ids_text: str | None, selected_text: str) -> list[list[int]]:
    """Expand XLA's mesh-axes notation the way XLA itself does (replica_group.cc).

    The mesh's device array is reshaped so that every selected (sub-)axis is a dimension of its
    own, the selected dimensions are moved last in the order the selection lists them, and each
    row of the result is one group. ``{'b','a'}`` therefore orders a group's members by ``b``
    first, as a dimension split ``P(('b', 'a'))`` orders its blocks.
    """
    names, sizes = [], []
    for item in _split_top(axes_text):
        name, size = item.rsplit("=", 1)
        names.append(name.strip().strip("'\""))
        sizes.append(int(size))
    devices = _mesh_devices(sizes, ids_text)
    selected: list[tuple[int, tuple[int, int] | None]] = []
    for item in _split_top(selected_text):
        m = re.fullmatch(r"'?\"?([^'\":]+)'?\"?(?::\((\d+)\)(\d+))?", item.strip())
        if m is None or m.group(1) not in names:
            raise ValueError(f"Cannot read the mesh axis {item!r} in replica groups.")
        sub = (int(m.group(2)), int(m.group(3))) if m.group(2) else None
        selected.append((names.index(m.group(1)), sub))
    reshape: list[int] = []
    position: dict[int, int] = {}  # selected item -> its dimension after the reshape
    for dim, full in enumerate(sizes):
        refs = [k for k, (d, _) in enumerate(selected) if d == dim]
        if not refs or selected[refs[0]][1] is None:
            if refs:
                position[refs[0]] = len(reshape)
            reshape.append(full)
            continue
        product = 1  # sub-axes of one axis, from its major end: (pre-size)size
        for k in sorted(refs, key=lambda k: selected[k][1][0]):
            pre, size = selected[k][1]
            if pre != product:
                reshape.append(pre // product)
                product = pre
            position[k] = len(reshape)
            reshape.append(size)
            product *= size
        if product != full:
            reshape.append(full // product)
    grouped = [position[k] for k in range(len(selected))]
    perm = [d for d in range(len(reshape)) if d not in grouped] + grouped
    size = math.prod(reshape[d] for d in grouped)
    return devices.reshape(reshape).transpose(perm).reshape(-1, size).tolist()


_MESH_GROUPS = re.compile(
    r"mesh\[(?P<axes>[^\]]*)\]"
    r"(?:,\s*device_ids=\((?P<ids>(?:[^()]|\([^()]*\))*)\))?"
    r"\s*\{(?P<sel>[^}]*)\}"
)
_MAXIMAL_MESH = re.compile(r"maximal_mesh\[device_id=(\d+)\]\s*\{[^}]*\}")
_IOTA_GROUPS = re.compile(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")


def _groups(attrs: str, num_devices: int) -> tuple[tuple[int, ...], ...]:
    pairs = re.search(r"source_target_pairs=", attrs)
    if pairs:
        block = attrs[pairs.end() : _close(attrs, pairs.end())]
        return tuple(tuple(p) for p in _explicit_groups(block))
    m = re.search(r"replica_groups=", attrs)
    if m is None:
        return (tuple(range(num_devices)),)
    rest = attrs[m.end() :]
    if rest.startswith("{"):
        groups = _explicit_groups(rest[: _close(rest, 0)])
        return tuple(map(tuple, groups)) or (tuple(range(num_devices)),)
    iota = _IOTA_GROUPS.match(rest)
    if iota:
        dims, reshape, perm = (_ints(g or "") for g in iota.groups())
        return tuple(map(tuple, _iota(dims, reshape, perm).tolist()))
    mesh = _MESH_GROUPS.match(rest)
    if mesh:
        groups = _mesh_groups(mesh.group("axes"), mesh.group("ids"), mesh.group("sel"))
        return tuple(map(tuple, groups))
    maximal = _MAXIMAL_MESH.match(rest)
    if maximal:
        return ((int(maximal.group(1)),),)
    raise ValueError(f"Cannot read replica groups from {rest[:80]!r}.")


def _base_op(op: str) -> str | None:
    """The collective an opcode is, for plain ops and async -start/-done halves."""
    for name in COLLECTIVES:
        if op in (name, f"{name}-start", f"{name}-done"):
            return name
    return None


def _row(inst: _Instruction, op: str, attrs_from: _Instruction, num_devices: int) -> Collective:
    arrays = _arrays(inst.type)
    shapes = tuple(dims for _, dims in arrays)
    elems = list(dict.fromkeys(elem for elem, _ in arrays))
    return Collective(
        op=op,
        shape=shapes[0] if len(shapes) == 1 else shapes,
        dtype=",".join(_dtype_name(e) for e in elems),
        bytes=sum(math.prod(dims) * _bits(elem) // 8 for elem, dims in arrays),
        groups=_groups(attrs_from.attrs, num_devices),
        name=attrs_from.name,
        computation=inst.computation,
    )


def collectives(compiled) -> list[Collective]:
    """The collectives in a compiled program, one row each, in the order the module lists them.

    Within a computation that is execution order; XLA prints called computations (loop bodies,
    async wrappers) before the entry computation. An asynchronous pair (``all-gather-start`` /
    ``all-gather-done``) is one transfer, so it is one row, with the result shape of the
    ``-done`` half. Every computation is searched, and a collective in a loop body is listed once
    however many times the loop runs.
    """
    module = _parse(_text(compiled))
    names = {i.name: i for insts in module.computations.values() for i in insts}
    rows = []
    for insts in module.computations.values():
        for inst in insts:
            op = _base_op(inst.op)
            if op is None or inst.op.endswith("-start"):
                continue
            start = inst
            if inst.op.endswith("-done") and inst.operands and inst.operands[0] in names:
                start = names[inst.operands[0]]
            rows.append(_row(inst, op, start, module.num_devices))
    return rows


def shape_text(row: Collective) -> str:
    """A row's shape per device as text: ``[8, 32]``, or ``4 × [1, 4, 8]`` for a tuple of parts."""
    if row.shape and isinstance(row.shape[0], tuple):
        if len(set(row.shape)) == 1:
            return f"{len(row.shape)} × {list(row.shape[0])}"
        return "(" + ", ".join(str(list(s)) for s in row.shape) + ")"
    return str(list(row.shape))


def groups_text(row: Collective, limit: int = 4) -> str:
    """The groups of a row in a few characters: ``{0,4} {1,5} … (4 groups of 2)``."""
    if row.op == "collective-permute":
        pairs = [f"{a}→{b}" for a, b in row.groups]
        shown = ", ".join(pairs[: 2 * limit])
        return shown + (f", … ({len(pairs)} pairs)" if len(pairs) > 2 * limit else "")
    parts = ["{" + ",".join(map(str, g)) + "}" for g in row.groups]
    shown = " ".join(parts[:limit])
    if len(parts) > limit:
        shown += " …"
    return f"{shown} ({len(parts)} group{'s' if len(parts) > 1 else ''} of {row.group_size})"


_TABLE_CSS = """<style>
.bk-hlo-wrap{overflow-x:auto;max-width:100%}
.bk-hlo{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;
border-collapse:collapse;margin:4px 0}
.bk-hlo th,.bk-hlo td{border:1px solid #bbb;padding:2px 8px;text-align:left;white-space:nowrap}
.bk-hlo th{background:#eee}
.bk-hlo td.num{text-align:right}
.bk-hlo caption{caption-side:top;text-align:left;font-weight:bold;padding-bottom:2px}
.bk-hlo-note{font-size:12px;margin:2px 0 8px}
</style>"""


def table(headers, rows, *, title: str | None = None, note: str | None = None) -> Rendered:
    """A small HTML table with a plain-text twin, for facts read from compiled programs.

    Numbers are right-aligned and written with thousands separators. ``note`` is a footnote
    printed under the table, for what a row cannot say by itself.
    """
    headers = [str(h) for h in headers]
    rows = [list(row) for row in rows]
    cells = [[f"{v:,}" if isinstance(v, int) else str(v) for v in row] for row in rows]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = ""
    for row, texts in zip(rows, cells, strict=True):
        tds = [
            f"<td class='num'>{html.escape(c)}</td>"
            if isinstance(v, (int, float))
            else f"<td>{html.escape(c)}</td>"
            for v, c in zip(row, texts, strict=True)
        ]
        body += "<tr>" + "".join(tds) + "</tr>"
    caption = f"<caption>{html.escape(title)}</caption>" if title else ""
    markup = (
        f"{_TABLE_CSS}<div class='bk-hlo-wrap'><table class='bk-hlo'>{caption}"
        f"<tr>{head}</tr>{body}</table></div>"
    )
    if note:
        markup += f"<p class='bk-hlo-note'>{html.escape(note)}</p>"
    widths = [max(len(x) for x in col) for col in zip(headers, *cells, strict=True)]
    lines = [title] if title else []
    for texts in [headers, *cells]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(texts, widths, strict=True)).rstrip())
    if note:
        lines.append(note)
    return Rendered(markup, "\n".join(lines))


def collective_table(compiled, *, title: str | None = None) -> Rendered:
    """The collectives of a compiled program as a table: op, shape, dtype, bytes, groups."""
    rows = collectives(compiled)
    if not rows:
        message = "No collectives: every device computes on the data it already holds."
        text = f"{title}: {message}" if title else message
        return Rendered(f"{_TABLE_CSS}<p class='bk-hlo'>{html.escape(text)}</p>", text)
    body = [[k, r.op, shape_text(r), r.dtype, r.bytes, groups_text(r)] for k, r in enumerate(rows)]
    body.append(["", "total", "", "", sum(r.bytes for r in rows), ""])
    headers = ["#", "collective", "shape per device", "dtype", "bytes per device", "groups"]
    return table(headers, body, title=title)


# Ops that only rename or reinterpret a value: drawing them would hide the data flow.
_PASS_THROUGH = {"get-tuple-element", "bitcast", "tuple", "async-update", "opt-barrier"}
_HIDDEN = {"constant"}
_DULL_FUSED = set(
    "parameter constant bitcast broadcast reshape copy get-tuple-element tuple convert iota".split()
)
_COLLECTIVE_STYLE = 'style="filled,bold" fillcolor="#f4cccc" color="#cc0000" penwidth=2'
_FUSION_STYLE = 'style="filled,rounded" fillcolor="#fff2cc" color="#b7950b"'
_PARAM_STYLE = 'shape=ellipse style=filled fillcolor="#cfe2f3" color="#3d85c6"'
_OTHER_STYLE = 'style="rounded" color="#666666"'


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _short_type(inst: _Instruction) -> str:
    parts = [f"{e}[{','.join(map(str, d))}]" for e, d in _arrays(inst.type)]
    if len(parts) > 1 and len(set(parts)) == 1:
        return f"{len(parts)} × {parts[0]}"
    if len(parts) > 3:
        parts = parts[:3] + [f"… {len(parts)} arrays"]
    return ", ".join(parts) if len(parts) <= 1 else "(" + ", ".join(parts) + ")"


def _fused_ops(module: _Module, inst: _Instruction) -> str:
    called = re.search(r"calls=%?([\w.\-]+)", inst.attrs)
    body = module.computations.get(called.group(1), []) if called else []
    ops = list(dict.fromkeys(i.op for i in body if i.op not in _DULL_FUSED))
    if not ops:
        ops = list(dict.fromkeys(i.op for i in body if i.op != "parameter"))[:1]
    return ", ".join(ops[:3]) + (", …" if len(ops) > 3 else "")


def _async_collective(module: _Module, inst: _Instruction) -> str | None:
    called = re.search(r"calls=%?([\w.\-]+)", inst.attrs)
    for i in module.computations.get(called.group(1), []) if called else []:
        if _base_op(i.op):
            return _base_op(i.op)
    return None


def graph(compiled, *, title: str | None = None) -> Diagram:
    """The entry computation of a compiled program as a Graphviz data-flow graph.

    Each fusion is one node labelled with the main operations inside it, collectives are red
    and carry their bytes and groups, parameters are named after the function's arguments, and
    renaming ops (tuples, bitcasts, get-tuple-element) and constants are left out so a small
    program reads at a glance. Identical sibling nodes (the same operation on the same inputs,
    feeding the same consumers) are drawn once, marked with how many there are.
    """
    module = _parse(_text(compiled))
    insts = module.computations[module.entry]
    alias: dict[str, list[int]] = {}
    labels: list[str] = []
    styles: list[str] = []
    inputs: list[list[int]] = []

    def sources(name: str) -> list[int]:
        return alias.get(name, [])

    def gather(names) -> list[int]:
        found: list[int] = []
        for name in names:
            found += [s for s in sources(name) if s not in found]
        return found

    for inst in insts:
        base = _base_op(inst.op)
        if inst.op in _HIDDEN:
            alias[inst.name] = []
            continue
        if inst.op in _PASS_THROUGH or inst.op == "async-done" or (base and "-done" in inst.op):
            alias[inst.name] = gather(inst.operands)
            continue
        shape = _short_type(inst)
        if inst.op == "async-start":
            base = _async_collective(module, inst)
        if base:
            done = next(
                (i for i in insts if i.operands[:1] == [inst.name] and i.op.endswith("done")),
                inst,
            )
            row = _row(done, base, inst, module.num_devices)
            label = f"{base}\n{_short_type(done)}\n{row.bytes:,} B\n{groups_text(row, 2)}"
            style = _COLLECTIVE_STYLE
        elif inst.op == "parameter":
            arg = re.search(r'op_name="([^"]*)"', inst.attrs)
            label = f"{arg.group(1) if arg else 'parameter'}\n{shape}"
            style = _PARAM_STYLE
        elif inst.op == "fusion":
            label = f"fusion: {_fused_ops(module, inst)}\n{shape}"
            style = _FUSION_STYLE
        else:
            label = f"{inst.op}\n{shape}"
            style = _OTHER_STYLE
        alias[inst.name] = [len(labels)]
        inputs.append(gather(inst.operands))
        labels.append(label)
        styles.append(style)
    root = next((i for i in insts if i.root), insts[-1] if insts else None)
    outputs = sources(root.name) if root is not None else []

    # Merge identical siblings: same label, same inputs, same consumers.
    consumers = [
        tuple(j for j, ins in enumerate(inputs) if k in ins) + (("out",) if k in outputs else ())
        for k in range(len(labels))
    ]
    keep: dict[tuple, int] = {}
    merged: dict[int, int] = {}
    counts: dict[int, int] = {}
    for k, label in enumerate(labels):
        key = (label, tuple(inputs[k]), consumers[k])
        first = keep.setdefault(key, k)
        merged[k] = first
        counts[first] = counts.get(first, 0) + 1
    nodes, edges, text = [], [], []
    number = {k: n for n, k in enumerate(k for k in range(len(labels)) if merged[k] == k)}
    for k, label in enumerate(labels):
        if merged[k] != k:
            continue
        if counts[k] > 1:
            label = f"{counts[k]} × {label}"
        nodes.append(f"n{k} [label={_quote(label)} {styles[k]}];")
        for s in dict.fromkeys(merged[i] for i in inputs[k]):
            edges.append(f"n{s} -> n{k};")
        given = ", ".join(f"[{number[i]}]" for i in dict.fromkeys(merged[i] for i in inputs[k]))
        line = f"[{number[k]}] " + label.replace("\n", " ")
        text.append(line + (f"  <- {given}" if given else ""))
    nodes.append('out [label="output" shape=plaintext];')
    edges += [f"n{s} -> out;" for s in dict.fromkeys(merged[k] for k in outputs)]
    lines = [
        "digraph hlo {",
        "rankdir=TB;",
        'node [shape=box fontname="Helvetica" fontsize=11];',
        'edge [color="#555555"];',
        *nodes,
        *edges,
    ]
    if title:
        lines.append(f"label={_quote(title)}; labelloc=t;")
    lines.append("}")
    heading = [title] if title else []
    return Diagram("\n".join(lines), "\n".join(heading + text))


# Reading the program itself -------------------------------------------------------------------

# The attributes that say where data lives or how it moves. Layouts, metadata, channel ids and
# backend configuration are left out of listings: they fill every line and bear on neither.
_WHERE = ("sharding", "replica_groups", "source_target_pairs")
_NAME = re.compile(r"[A-Za-z_][\w.\-]*")


@dataclass(frozen=True)
class Instruction:
    """One instruction of a compiled program's entry computation, trimmed for reading.

    ``type`` is the result type on one device without layouts (``f32[8,32]``) and ``shape`` its
    dimensions (a tuple of them for a tuple result). ``fused`` names the operations inside a
    fusion or async wrapper, so that one the compiler merged with its neighbours, such as a
    ``dynamic-slice``, can still be found. ``details`` are the attributes that say where data
    lives or moves (``sharding=``, ``replica_groups=``, ``source_target_pairs=``).
    """

    name: str
    op: str
    type: str
    shape: tuple
    operands: tuple[str, ...] = ()
    fused: tuple[str, ...] = ()
    details: tuple[str, ...] = ()
    root: bool = False

    def does(self, op: str) -> bool:
        """Whether this instruction is ``op`` or contains it."""
        return self.op == op or op in self.fused

    @property
    def main_fused(self) -> tuple[str, ...]:
        """The operations of ``fused`` that do the work, without reshapes, copies and such."""
        return tuple(op for op in self.fused if op not in _DULL_FUSED) or self.fused[:1]

    def text(self, width: int = 88) -> str:
        """The instruction on one line, each kept attribute indented on a line below."""
        root = "ROOT " if self.root else ""
        lines = [f"{root}%{self.name} = {self.type} {self.op}({', '.join(self.operands)})"]
        if self.fused:
            lines.append("    fuses " + ", ".join(self.main_fused))
        lines += [f"    {d}" for d in self.details]
        return "\n".join(_wrap(line, width) for line in lines)


def _wrap(line: str, width: int) -> str:
    if len(line) <= width:
        return line
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return textwrap.fill(
        line,
        width,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def instructions(compiled, op: str | None = None) -> list[Instruction]:
    """The instructions of a compiled program's entry computation, in order.

    With ``op``, only those that do it: that are one, or are a fusion (or async wrapper)
    containing one, since compilers fuse small operations into their neighbours and the fusion
    is what the entry computation lists.
    """
    module = _parse(_text(compiled))
    insts = module.computations[module.entry]
    names = {i.name for i in insts}
    found = []
    for inst in insts:
        called = re.search(r"calls=%?([\w.\-]+)", inst.attrs)
        body = module.computations.get(called.group(1), []) if called else []
        fused = tuple(dict.fromkeys(i.op for i in body if i.op != "parameter"))
        parts: list[str] = []
        for part in _split_top(inst.attrs.lstrip(", ")):
            if part.startswith("device_ids=") and parts:  # mesh-axes groups go on past a comma
                parts[-1] += ", " + part
            else:
                parts.append(part)
        details = tuple(part for part in parts if part.split("=", 1)[0] in _WHERE)
        dims = tuple(d for _, d in _arrays(inst.type))
        operands = tuple(f"%{o}" if o in names else o for o in inst.operands)
        if any(o not in names and not re.fullmatch(r"[\w.+\-]+", o) for o in inst.operands):
            operands = ("…",)  # an array literal, such as a constant's values
        row = Instruction(
            name=inst.name,
            op=inst.op,
            type=re.sub(r"\{[^{}]*\}", "", inst.type).strip(),
            shape=dims[0] if len(dims) == 1 else dims,
            operands=operands,
            fused=fused,
            details=details,
            root=inst.root,
        )
        if op is None or row.does(op):
            found.append(row)
    return found


def listing(compiled, *, ops=None, width: int = 88) -> str:
    """The entry computation of a compiled program as short text, one instruction at a time.

    ``.as_text()`` puts layouts, metadata and backend configuration on every line, which hides
    what a reader looks for: each result's shape on one device and the collectives' groups (and
    the parameters' shardings, where the XLA version prints them: jax 0.10's does, 0.12's leaves
    them out, and ``compiled.input_shardings`` has them in every version). Here each
    instruction is one line (its name, result type, op and operands), a fusion says which
    operations it merges, and only the attributes of ``Instruction.details`` follow, indented.
    With ``ops``, only instructions doing one of them are listed.
    """
    rows = instructions(compiled)
    if ops is not None:
        wanted = [ops] if isinstance(ops, str) else list(ops)
        rows = [r for r in rows if any(r.does(op) for op in wanted)]
    return "\n".join(r.text(width) for r in rows)


_SDY_SHARDING = re.compile(r"#sdy\.sharding<([^>]*)>")
_MLIR_OP = re.compile(r'^(?P<indent>\s*)(?P<lhs>%[^=]+?) = "?(?P<op>[\w.]+)"?(?P<rest>.*)$')


def _typed_value(text: str) -> str:
    """``%arg0: tensor<16x32xf32> {sdy.sharding = ...}`` as ``%arg0: tensor<...> sharding<...>``."""
    head = text.split(" {", 1)[0].strip()
    sharding = _SDY_SHARDING.search(text)
    return f"{head} sharding<{sharding.group(1)}>" if sharding else head


def stablehlo_listing(lowered, *, width: int = 88) -> str:
    """The ``main`` function of a lowered program as short text, before any partitioning.

    The signature gives one argument per line with the sharding it carries (Shardy's
    ``sharding<@mesh, [{"data"}, {}]>``: one brace per dimension, naming the mesh axes that split
    it). The body gives one operation per line: results, op, operands and result type, with
    constants' values and sharding constraints kept and other attributes left out.
    """
    text = lowered if isinstance(lowered, str) else lowered.as_text()
    start = text.index("func.func public @main(")
    open_at = text.index("(", start)
    close_at = _close(text, open_at)
    args = _split_top(text[open_at + 1 : close_at - 1], "([{<", ")]}>")
    end_of_signature = text.index("\n", close_at)
    results = text[close_at:end_of_signature].strip().removeprefix("->").strip()
    results = results.removesuffix("{").strip()
    if results.startswith("("):
        results = results[1 : _close(results, 0) - 1]
    lines = ["@main("]
    lines += [
        f"    {_typed_value(a)}{',' if k < len(args) - 1 else ''}" for k, a in enumerate(args)
    ]
    outs = [_typed_value(r) for r in _split_top(results, "([{<", ")]}>")]
    lines.append(f") -> {', '.join(outs)}")
    for line in text[end_of_signature + 1 :].splitlines():
        if line.rstrip() == "  }":
            break
        m = _MLIR_OP.match(line)
        if m is None:
            lines.append(line.rstrip()[2:])
            continue
        rest = m.group("rest")
        values, _, types = rest.rpartition(" : ")
        if not values:
            values, types = rest, ""
        kept = re.findall(r"%[\w#.\-]+|dense<[^>]*>|<@[^>]*>", values)
        result_type = types.rsplit("->", 1)[-1].strip()
        body = f"{m.group('indent')[2:]}{m.group('lhs')} = {m.group('op')} {', '.join(kept)}"
        lines.append(f"{body.rstrip()} : {result_type}" if result_type else body.rstrip())
    return "\n".join(_wrap(line, width) for line in lines)
