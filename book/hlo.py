"""What the compiler made: the collectives, instructions and data flow of a compiled program.

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

Everything here returns plain data; ``book.display`` turns it into tables, listings and graphs.
"""

from __future__ import annotations

import collections
import difflib
import math
import os
import re
import sys
import tempfile
import unicodedata
from dataclasses import dataclass, replace

import numpy as np

from book import validate
from book.errors import ReaderError

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

    ``shapes`` are the shapes of the result on one device: one for a collective that moves one
    array, several for one that moves several at once (a tuple result, as when the compiler
    combines the all-reduces of many gradients). ``dtype`` is the element type, the types joined
    by commas when they differ. ``bytes`` is the result's size on one device. ``groups`` are
    the device groups that communicate, or for a collective-permute the (source, target) pairs.
    """

    op: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    bytes: int
    groups: tuple[tuple[int, ...], ...]
    name: str = ""
    computation: str = ""

    @property
    def group_size(self) -> int:
        """How many devices take part in each group (2 for every collective-permute pair)."""
        return len(self.groups[0]) if self.groups else 0


class HloError(ReaderError, ValueError):
    """A program or text that cannot be read as what was asked for, in one sentence."""


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
    """The program's HLO text; a lowered program's StableHLO text is refused.

    ``lowered.as_text()`` is StableHLO, written before the compiler partitions the program and
    inserts its collectives, and in another language than HLO: read as HLO it would say "no
    communication" of a program that communicates. HLO text is read as it is, a compiled
    program's or, as chapter 8 does on purpose, a lowered one's (``as_text(dialect="hlo")``),
    whose collectives are the ones the program writes out itself.
    """
    compiled = validate.compiled(compiled)  # a function or a lowered program: one sentence
    text = compiled if isinstance(compiled, str) else compiled.as_text()
    if text.lstrip().startswith("module") or "func.func " in text[:200_000]:
        raise HloError(
            "This is a lowered program's StableHLO, written before the compiler partitions it "
            "and inserts its collectives; pass f.lower(*args).compile() or its .as_text()."
        )
    return text


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
    num_devices = _devices(partitions.group(1)) if partitions else 1
    num_devices *= _devices(replicas.group(1)) if replicas else 1
    _devices(str(num_devices))
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
        raise HloError("No HLO computations found: pass a compiled program or its .as_text().")
    return _Module(computations, entry or list(computations)[-1], num_devices)


def _arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
    """The (element type, dimensions) of every array in an HLO type, tuples flattened."""
    found = []
    for elem, dims in _ARRAY.findall(type_text):
        if elem == "token":
            continue
        try:
            sizes = tuple(int(d.replace("<=", "")) for d in dims.split(",") if d.strip())
        except ValueError:  # a dimension of thousands of digits, edited by hand
            raise HloError(
                f"Cannot read the dimensions {validate.describe(dims[:40])}; pass the text a "
                "compiled program printed."
            ) from None
        found.append((elem, sizes))
    return found


def _bits(elem: str) -> int:
    if elem == "pred":
        return 8
    if elem in ("c64", "c128"):
        return int(elem[1:])
    m = re.match(r"(?:bf|[suf])(\d+)", elem)
    if m is None:
        raise HloError(f"Unknown HLO element type {validate.describe(elem)}.")
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


def _devices(digits: str) -> int:
    """A count of devices written in a program's text: at most what any machine has."""
    if len(digits) > 6 or int(digits) > validate.MAX_DEVICES:
        raise HloError(
            f"The text names {validate.describe(digits)} devices, more than any machine has "
            f"({validate.MAX_DEVICES:,}); pass the text a compiled program printed."
        )
    return int(digits)


def _iota(dims, reshape, perm) -> np.ndarray:
    _devices(str(math.prod(reshape)))
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
    _devices(str(math.prod(sizes)))
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
            raise HloError(
                f"Cannot read the mesh axis {validate.describe(item)} in replica groups; a mesh "
                "axis named with , : = [ ] or } cannot be read: rename the axis."
            )
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
    """A collective's device groups, in any of XLA's notations; text edited by hand that no
    notation reads (sizes that do not multiply, say) is refused, not half read."""
    try:
        return _read_groups(attrs, num_devices)
    except HloError:
        raise
    except (ValueError, IndexError, KeyError, ZeroDivisionError):
        raise HloError(
            f"Cannot read replica groups from {validate.describe(attrs[:80], 80)}{_hint(attrs)}."
        ) from None


def _read_groups(attrs: str, num_devices: int) -> tuple[tuple[int, ...], ...]:
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
    raise HloError(
        f"Cannot read replica groups from {validate.describe(rest[:80], 80)}{_hint(rest)}."
    )


def _hint(text: str) -> str:
    """What to change where a mesh axis's own name holds the notation's separators."""
    if "mesh[" in text and re.search(r"'[^']*[,:}\]\[=][^']*'", text):
        return "; a mesh axis named with , : = [ ] or } cannot be read: rename the axis"
    return ""


def _base_op(op: str) -> str | None:
    """The collective an opcode is, for plain ops and async -start/-done halves."""
    for name in COLLECTIVES:
        if op in (name, f"{name}-start", f"{name}-done"):
            return name
    return None


def _row(inst: _Instruction, op: str, attrs_from: _Instruction, num_devices: int) -> Collective:
    arrays = _arrays(inst.type)
    elems = list(dict.fromkeys(elem for elem, _ in arrays))
    return Collective(
        op=op,
        shapes=tuple(dims for _, dims in arrays),
        dtype=",".join(_dtype_name(e) for e in elems),
        bytes=sum(math.prod(dims) * _bits(elem) // 8 for elem, dims in arrays),
        groups=_groups(attrs_from.attrs, num_devices),
        name=attrs_from.name,
        computation=inst.computation,
    )


@validate.impostors_refused
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


@validate.impostors_refused
def loop_trips(compiled) -> dict[str, int]:
    """How many times each loop body of a compiled program runs: ``{body: trips}``.

    JAX offers no API for a loop's trip count; XLA writes it on the ``while`` instruction
    (``known_trip_count``) once it knows it. A ``Collective``'s ``computation`` names the body it
    sits in, so a collective in a loop runs that many times a step. A loop inside another loop's
    body runs its count once per trip of the outer one (chapter 14's pipeline: the layers' loop
    inside the schedule's), also where XLA:CPU wraps the inner ``while`` in a computation of its
    own that the outer body calls. A loop in a branch of a ``conditional`` counts as if the branch
    ran at every trip of the loops around it: the most it can run. A loop whose count XLA does not
    know (a ``while_loop`` on data) is left out, and so is every loop inside it.
    """
    text = _text(compiled)
    _parse(text)  # a text that is no program: one sentence, not "no loops"
    loops, caller, computation, unknown = {}, {}, None, set()
    for line in text.splitlines():
        header = re.match(r"(?:ENTRY )?%?([\w.\-]+) .*\{$", line)  # a computation begins
        if header:
            computation = header.group(1)
            continue
        callees = re.findall(
            r"(?:calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)",
            line,
        )
        for branches in re.findall(r"branch_computations=\{([^}]*)\}", line):
            callees += re.findall(r"%?([\w.\-]+)", branches)
        for callee in callees:
            caller.setdefault(callee, computation)
        found = re.search(r'body=%?([\w.\-]+).*"known_trip_count":\{"n":"(\d{1,18})"', line)
        if found:
            loops[found.group(1)] = int(found.group(2))
        elif " while(" in line:  # a loop whose count only the run knows
            unknown.update(re.findall(r"body=%?([\w.\-]+)", line))

    def runs(name):
        """How often a computation runs per call of the program; None where a loop around
        it has a count only the run knows."""
        count, seen = 1, set()
        while name in caller and name not in seen:  # up to the entry; a cycle stops it
            seen.add(name)
            if name in unknown:
                return None
            count *= loops.get(name, 1)
            name = caller[name]
        return count

    counted = {body: runs(body) for body in loops}
    return {body: n for body, n in counted.items() if n is not None}


# The data flow of the entry computation --------------------------------------------------------

# Ops that only rename or reinterpret a value: a graph that drew them would hide the data flow.
_PASS_THROUGH = {"get-tuple-element", "bitcast", "tuple", "async-update", "opt-barrier"}
_HIDDEN = {"constant"}
_DULL_FUSED = set(
    "parameter constant bitcast broadcast reshape copy get-tuple-element tuple convert iota".split()
)


@dataclass(frozen=True)
class Node:
    """One step of a program's data flow: a collective, a parameter, a fusion or another op.

    ``what`` is the collective's name, the argument's name, the main operations a fusion
    merges, or the op; ``type`` the result type on one device; ``inputs`` the positions of the
    nodes it reads; ``count`` how many identical siblings it stands for.
    """

    kind: str
    what: str
    type: str
    inputs: tuple[int, ...] = ()
    count: int = 1
    collective: Collective | None = None


@dataclass(frozen=True)
class Dataflow:
    """The entry computation as nodes in order, and the positions of those it returns."""

    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]


def _short_type(inst: _Instruction) -> str:
    parts = [f"{e}[{','.join(map(str, d))}]" for e, d in _arrays(inst.type)]
    if len(parts) > 1 and len(set(parts)) == 1:
        return f"{len(parts)} × {parts[0]}"
    if len(parts) > 3:
        parts = parts[:3] + [f"… {len(parts)} arrays"]
    return ", ".join(parts) if len(parts) <= 1 else "(" + ", ".join(parts) + ")"


def _called(module: _Module, inst: _Instruction) -> list[_Instruction]:
    """The body of the computation an instruction calls (a fusion's or an async wrapper's)."""
    called = re.search(r"calls=%?([\w.\-]+)", inst.attrs)
    return module.computations.get(called.group(1), []) if called else []


_CONTROL = re.compile(
    r"(?:body|condition|to_apply|true_computation|false_computation)=%?([\w.\-]+)"
)


def _inside(module: _Module, inst: _Instruction, seen: set | None = None) -> list[_Instruction]:
    """Every instruction ``inst`` runs: a fusion's or an async wrapper's body, and a loop's,
    a call's or a conditional's computations, with what those run in turn (XLA:CPU wraps a
    small loop in a call)."""
    names = re.findall(r"calls=%?([\w.\-]+)", inst.attrs)
    if inst.op in ("while", "call", "conditional"):
        names += _CONTROL.findall(inst.attrs)
        branches = re.search(r"branch_computations=\{([^}]*)\}", inst.attrs)
        if branches:
            names += [b.strip().lstrip("%") for b in branches.group(1).split(",")]
    seen = set() if seen is None else seen
    found = []
    for name in names:
        if name not in seen:
            seen.add(name)
            for called in module.computations.get(name, []):
                found += [called, *_inside(module, called, seen)]
    return found


def _fused_ops(module: _Module, inst: _Instruction) -> str:
    body = _called(module, inst)
    ops = list(dict.fromkeys(i.op for i in body if i.op not in _DULL_FUSED))
    if not ops:
        ops = list(dict.fromkeys(i.op for i in body if i.op != "parameter"))[:1]
    return ", ".join(ops[:3]) + (", …" if len(ops) > 3 else "")


def _async_collective(module: _Module, inst: _Instruction) -> str | None:
    return next((_base_op(i.op) for i in _called(module, inst) if _base_op(i.op)), None)


@validate.impostors_refused
def dataflow(compiled) -> Dataflow:
    """The entry computation of a compiled program as the steps a reader follows.

    Each fusion is one node named after the main operations inside it, parameters are named
    after the function's arguments, and renaming ops (tuples, bitcasts, get-tuple-element) and
    constants are left out, so that a small program reads at a glance. Identical siblings (the
    same operation on the same inputs, feeding the same consumers) are one node with a count.
    """
    module = _parse(_text(compiled))
    insts = module.computations[module.entry]
    alias: dict[str, list[int]] = {}
    found: list[Node] = []

    def gather(names) -> tuple[int, ...]:
        sources: dict[int, None] = {}  # ordered, each once
        for name in names:
            sources.update(dict.fromkeys(alias.get(name, [])))
        return tuple(sources)

    ends: dict[str, _Instruction] = {}  # an async or start instruction's name: its done
    for inst in insts:
        if inst.op.endswith("done") and inst.operands:
            ends.setdefault(inst.operands[0], inst)

    for inst in insts:
        base = _base_op(inst.op)
        if inst.op in _HIDDEN:
            alias[inst.name] = []
            continue
        if inst.op in _PASS_THROUGH or inst.op == "async-done" or (base and "-done" in inst.op):
            alias[inst.name] = list(gather(inst.operands))
            continue
        if inst.op == "async-start":
            base = _async_collective(module, inst)
        if base:
            done = ends.get(inst.name, inst)
            row = _row(done, base, inst, module.num_devices)
            node = Node("collective", base, _short_type(done), collective=row)
        elif inst.op == "parameter":
            arg = re.search(r'op_name="([^"]*)"', inst.attrs)
            node = Node("parameter", arg.group(1) if arg else "parameter", _short_type(inst))
        elif inst.op == "fusion":
            node = Node("fusion", _fused_ops(module, inst), _short_type(inst))
        else:
            node = Node("other", inst.op, _short_type(inst))
        alias[inst.name] = [len(found)]
        found.append(replace(node, inputs=gather(inst.operands)))
    root = next((i for i in insts if i.root), insts[-1] if insts else None)
    outputs = alias.get(root.name, []) if root is not None else []
    return _merge_siblings(found, outputs)


def _merge_siblings(found: list[Node], outputs: list[int]) -> Dataflow:
    """One node for each set of identical siblings, inputs and outputs renumbered to match."""
    readers: list[list] = [[] for _ in found]
    for j, node in enumerate(found):
        for k in node.inputs:
            readers[k].append(j)
    returned = set(outputs)
    consumers = [tuple(r) + (("out",) if k in returned else ()) for k, r in enumerate(readers)]
    first: dict[tuple, int] = {}
    merged: dict[int, int] = {}
    for k, node in enumerate(found):
        merged[k] = first.setdefault((replace(node, inputs=()), node.inputs, consumers[k]), k)
    kept = [k for k in range(len(found)) if merged[k] == k]
    number = {k: n for n, k in enumerate(kept)}
    counts = collections.Counter(merged.values())
    nodes = []
    for k in kept:
        inputs = tuple(dict.fromkeys(number[merged[i]] for i in found[k].inputs))
        nodes.append(replace(found[k], inputs=inputs, count=counts[k]))
    return Dataflow(tuple(nodes), tuple(dict.fromkeys(number[merged[k]] for k in outputs)))


# Reading the program itself -------------------------------------------------------------------

# The attributes that say where data lives or how it moves. Layouts, metadata, channel ids and
# backend configuration are left out of listings: they fill every line and bear on neither.
_WHERE = ("sharding", "replica_groups", "source_target_pairs")


@dataclass(frozen=True)
class Instruction:
    """One instruction of a compiled program's entry computation, trimmed for reading.

    ``type`` is the result type on one device without layouts (``f32[8,32]``) and ``shapes``
    the dimensions of each array it returns, always a tuple of them, as ``Collective.shapes``.
    ``fused`` names the operations inside a fusion or async wrapper, so that one the compiler
    merged with its neighbours, such as a ``dynamic-slice``, can still be found. ``details`` are
    the attributes that say where data lives or moves (``sharding=``, ``replica_groups=``,
    ``source_target_pairs=``).
    """

    name: str
    op: str
    type: str
    shapes: tuple[tuple[int, ...], ...]
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


# JAX's names of operations, and what a compiled program calls each.
_JAX_NAMES = {
    "psum": "all-reduce",
    "pmean": "all-reduce",
    "pmax": "all-reduce",
    "pmin": "all-reduce",
    "all_gather": "all-gather",
    "psum_scatter": "reduce-scatter",
    "reduce_scatter": "reduce-scatter",
    "ppermute": "collective-permute",
    "all_to_all": "all-to-all",
    "ragged_all_to_all": "ragged-all-to-all",
    "dot_general": "dot",
    "matmul": "dot",
    **dict.fromkeys(
        "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor".split(),
        "reduce",
    ),
    "argmax": "reduce",
    "argmin": "reduce",
    "add_any": "add",
    "cos": "cosine",
    "sin": "sine",
    "log1p": "log-plus-one",
    "expm1": "exponential-minus-one",
    "select_n": "select",
    "broadcast_in_dim": "broadcast",
    "conv_general_dilated": "convolution",
    "cond": "conditional",
    "switch": "conditional",
    "scan": "while",
    "fori_loop": "while",
    "while_loop": "while",
    "pjit": "call",
    "jit": "call",
    "exp": "exponential",
    "mul": "multiply",
    "sub": "subtract",
    "div": "divide",
    "max": "maximum",
    "min": "minimum",
    "neg": "negate",
    "pow": "power",
    "rem": "remainder",
    "eq": "compare",
    "ne": "compare",
    "lt": "compare",
    "le": "compare",
    "gt": "compare",
    "ge": "compare",
    "convert_element_type": "convert",
    "axis_index": "partition-id",
    "integer_pow": "multiply",
}
# HLO's operations (XLA's hlo_opcode.h), as a compiled program names them.
_OPCODES = frozenset(
    """abs add add-dependency after-all all-gather all-gather-done all-gather-start all-reduce
    all-reduce-done all-reduce-start all-to-all and async-done async-start async-update atan2
    batch-norm-grad batch-norm-inference batch-norm-training bitcast bitcast-convert broadcast
    call cbrt ceil cholesky clamp collective-broadcast collective-permute
    collective-permute-done collective-permute-start compare complex concatenate conditional
    constant convert convolution copy copy-done copy-start cosine count-leading-zeros
    custom-call divide domain dot dynamic-reshape dynamic-slice dynamic-update-slice erf
    exponential exponential-minus-one fft floor fusion gather get-dimension-size
    get-tuple-element imag infeed iota is-finite log log-plus-one logistic map maximum minimum
    multiply negate not opt-barrier or outfeed pad parameter partition-id popcnt power
    ragged-all-to-all ragged-dot real recv recv-done reduce reduce-precision reduce-scatter
    reduce-window remainder replica-id reshape reverse rng rng-bit-generator
    rng-get-and-update-state round-nearest-afz round-nearest-even rsqrt scaled-dot scatter
    select select-and-scatter send send-done set-dimension-size shift-left
    shift-right-arithmetic shift-right-logical sign sine slice sort sqrt stochastic-convert
    subtract tan tanh topk transpose triangular-solve tuple while xor""".split()
)
_DASHES = dict.fromkeys(map(ord, "\u2010\u2011\u2012\u2013\u2014\u2212"), "-")


@validate.impostors_refused
def op_name(op, also=()) -> str:
    """An operation as HLO names it, lower case with hyphens, such as ``all-gather``.

    A name HLO does not have (nor ``also``, a program's own operations) matches no
    instruction, so it is refused, with the nearest of HLO's names.
    """
    op = validate.text(op, "the op", example="'all-gather'", error=HloError)
    also = () if also is None else validate.plain(also)
    if isinstance(also, str) or not isinstance(also, (list, tuple, set, frozenset)):
        raise HloError(
            f"also must be a list of operation names, such as ['my-op'], not "
            f"{validate.describe(also)}."
        )
    if not all(isinstance(name, str) for name in also):
        raise HloError("also must hold operation names, as texts such as 'my-op'.")
    known = _OPCODES | set(also)
    if op in known:
        return op
    plain = unicodedata.normalize("NFKC", op).translate(_DASHES).strip()
    guess = _JAX_NAMES.get(plain) or plain.lower().replace("_", "-").replace(" ", "-")
    if guess not in known:
        close = difflib.get_close_matches(guess, sorted(known), n=1, cutoff=0.7)
        guess = close[0] if close else None
    nearest = (
        f"HLO's nearest name is '{guess}'"
        if guess
        else "HLO names operations in lower case with hyphens, such as 'all-gather' or 'dot'"
    )
    raise HloError(
        f"HLO has no operation named {validate.describe(op, 40)}, so it matches no "
        f"instruction; {nearest}."
    )


@validate.impostors_refused
def instructions(compiled, op: str | None = None) -> list[Instruction]:
    """The instructions of a compiled program's entry computation, in order.

    With ``op``, only those that do it: that are one, or are a fusion (or async wrapper)
    containing one, since compilers fuse small operations into their neighbours and the fusion
    is what the entry computation lists, or a loop, call or conditional running one.
    """
    module = _parse(_text(compiled))
    insts = module.computations[module.entry]
    if op is not None:  # a number, a list or a misspelling would match nothing, silently
        op = op_name(op, {i.op for c in module.computations.values() for i in c})
    names = {i.name for i in insts}
    found = []
    for inst in insts:
        fused = tuple(dict.fromkeys(i.op for i in _inside(module, inst) if i.op != "parameter"))
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
            shapes=dims,
            operands=operands,
            fused=fused,
            details=details,
            root=inst.root,
        )
        if op is None or row.does(op):
            found.append(row)
    return found


_SDY_SHARDING = re.compile(r"#sdy\.sharding<([^>]*)>")
_MLIR_OP = re.compile(r'^(?P<indent>\s*)(?P<lhs>%[^=]+?) = "?(?P<op>[\w.]+)"?(?P<rest>.*)$')


def _typed_value(text: str) -> str:
    """``%arg0: tensor<16x32xf32> {sdy.sharding = ...}`` as ``%arg0: tensor<...> sharding<...>``."""
    head = text.split(" {", 1)[0].strip()
    sharding = _SDY_SHARDING.search(text)
    return f"{head} sharding<{sharding.group(1)}>" if sharding else head


@dataclass(frozen=True)
class StableMain:
    """The ``main`` function of a lowered program, before any partitioning, trimmed for reading.

    ``arguments`` and ``results`` are typed values with the Shardy sharding they carry
    (``%arg0: tensor<16x32xf32> sharding<@mesh, [{"data"}, {}]>``: one brace per dimension,
    naming the mesh axes that split it). ``operations`` are the body's lines, each with its
    results, op, operands and result type; constants' values and sharding constraints are kept,
    other attributes left out.
    """

    arguments: tuple[str, ...]
    results: tuple[str, ...]
    operations: tuple[str, ...]


def _stablehlo_text(lowered) -> str:
    """A lowered program's StableHLO text; anything else refused in one sentence."""
    import jax

    if isinstance(lowered, jax.stages.Compiled):
        raise validate.WrongKind(
            "This is a compiled program, whose text is HLO after partitioning; pass the lowered "
            "one, f.lower(*args), to read the shardings the program asks for."
        )
    if isinstance(lowered, jax.stages.Lowered):
        return lowered.as_text()
    lowered = validate.plain(lowered)
    if not isinstance(lowered, str):
        hint = ", not the function itself" if callable(lowered) else ""
        raise validate.WrongKind(
            f"Pass a lowered program, f.lower(*args){hint}, not {validate.describe(lowered)}."
        )
    if "func.func public @main(" not in lowered:
        raise HloError(
            "This text holds no StableHLO main function; pass f.lower(*args) or its .as_text()."
        )
    return lowered


@validate.impostors_refused
def stablehlo_main(lowered) -> StableMain:
    """Read the ``main`` function of ``jax.jit(f).lower(...)`` or of its ``.as_text()``."""
    text = _stablehlo_text(lowered)
    try:
        return _stablehlo_main(text)
    except (ValueError, IndexError):  # text cut short or edited by hand
        raise HloError(
            "The main function of this text cannot be read; pass f.lower(*args) or its "
            ".as_text() unchanged."
        ) from None


def _stablehlo_main(text: str) -> StableMain:
    start = text.index("func.func public @main(")
    open_at = text.index("(", start)
    close_at = _close(text, open_at)
    args = _split_top(text[open_at + 1 : close_at - 1], "([{<", ")]}>")
    end_of_signature = text.index("\n", close_at)
    results = text[close_at:end_of_signature].strip().removeprefix("->").strip()
    results = results.removesuffix("{").strip()
    if results.startswith("("):
        results = results[1 : _close(results, 0) - 1]
    operations = []
    for line in text[end_of_signature + 1 :].splitlines():
        if line.rstrip() == "  }":
            break
        m = _MLIR_OP.match(line)
        if m is None:
            operations.append(line.rstrip()[2:])
            continue
        rest = m.group("rest")
        values, _, types = rest.rpartition(" : ")
        if not values:
            values, types = rest, ""
        kept = re.findall(r"%[\w#.\-]+|dense<[^>]*>|<@[^>]*>", values)
        result_type = types.rsplit("->", 1)[-1].strip()
        body = f"{m.group('indent')[2:]}{m.group('lhs')} = {m.group('op')} {', '.join(kept)}"
        operations.append(f"{body.rstrip()} : {result_type}" if result_type else body.rstrip())
    return StableMain(
        arguments=tuple(_typed_value(a) for a in args),
        results=tuple(_typed_value(r) for r in _split_top(results, "([{<", ")]}>")),
        operations=tuple(operations),
    )


# The compiler_messages objects catching fd 2 now, in the order they began.
_CATCHING: list = []


class CompilerMessages:
    """What XLA printed to the process's standard error inside a ``with`` block, by line."""

    def __init__(self):
        self.lines: list[str] = []
        self._saved = None
        self._file = None

    def __enter__(self):
        if self._saved is not None:
            raise HloError(
                "This compiler_messages() is already catching messages; leave its with block "
                "first, or use a new compiler_messages() inside it."
            )
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile(mode="w+b")
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        _CATCHING.append(self)
        return self

    def __exit__(self, *exc):
        if self not in _CATCHING:
            raise HloError("This compiler_messages() is not catching; use it in a with block.")
        later = _CATCHING[_CATCHING.index(self) + 1 :]
        if later:  # one entered after this still catches: it puts back what this one found
            os.close(later[0]._saved)
            later[0]._saved = self._saved
        else:
            os.dup2(self._saved, 2)
            os.close(self._saved)
        _CATCHING.remove(self)
        self._saved = None
        self._file.seek(0)
        text = self._file.read().decode(errors="replace")
        self._file.close()
        self.lines = [line for line in text.splitlines() if line.strip()]
        return False


def compiler_messages() -> CompilerMessages:
    """Catch what XLA's C++ code logs while compiling, instead of letting it reach the page.

    XLA writes its warnings (the partitioner's "Involuntary full rematerialization", for one)
    straight to file descriptor 2, past Python's ``sys.stderr``, and a notebook shows them as
    a pink block wherever a compile happens. Inside ``with compiler_messages() as log:`` they go
    to ``log.lines`` instead, for a chapter to explain, assert on, or set aside.
    """
    return CompilerMessages()
