"""Read and check what a reader types or picks: mesh shapes, axis names, partition specs.

Everything is parsed by a small tokenizer; nothing a reader types is ever evaluated. Every
mistake raises ``SpecError`` whose message is one sentence saying what to change.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from jax.sharding import PartitionSpec as P

from book import validate
from book.errors import ReaderError

MAX_TEXT = validate.MAX_TEXT
_SIZE = re.compile(r"[0-9]{1,12}", re.ASCII)
_TOKEN = re.compile(
    r"\s*(?:(?P<str>'[^'\\]*'|\"[^\"\\]*\")|(?P<name>[A-Za-z_]\w*)|(?P<punct>[(),\[\]]))",
    re.ASCII,
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z", re.ASCII)


class SpecError(ReaderError, ValueError):
    """A mesh shape, axis name or partition spec that cannot work, explained in one sentence."""


_EXAMPLES = {
    "shape": "(8, 4)",
    "mesh shape": "(2, 4)",
    "axis names": "('data', 'model')",
    "partition spec": "P('data', None)",
}


def _check_length(text, what) -> str:
    """The text typed, as a plain ``str`` of at most ``MAX_TEXT`` characters."""
    return validate.text(
        text, f"the {what}", example=_EXAMPLES[what], limit=MAX_TEXT, error=SpecError
    )


def _parse_sizes(text: str, what: str) -> tuple[int, ...]:
    text = _check_length(text, what)
    body = text.strip()
    close = max(body.rfind(")"), body.rfind("]"))
    if body[:1] in "([" and close > 0:  # what follows the closing bracket is stray
        body, after = body[1:close], body[close + 1 :].strip()
        if after:
            raise SpecError(
                f"Unexpected {after[0]!r} after the closing bracket of the {what} "
                f"{validate.describe(text.strip(), 60)}; end it there, for example "
                f"{_EXAMPLES[what]}."
            )
    elif body.startswith(("(", "[")):
        raise SpecError(
            f"The {what} {validate.describe(text.strip(), 60)} has no closing bracket; close "
            f"it, for example {_EXAMPLES[what]}."
        )
    if "**" in body:
        raise SpecError(
            f"The {what} {validate.describe(text.strip(), 60)} writes a power; write each size "
            f"as a number, for example {_EXAMPLES[what]}."
        )
    if not body.strip():  # "()": a scalar, which no split or mesh here can show
        raise SpecError(
            f"The {what} {text.strip()!r} has no sizes; give at least one, for example "
            f"{_EXAMPLES[what]}."
        )
    stray = re.search(r"[^\w\s,×*]", body)  # a word is named whole, below
    if stray:
        raise SpecError(
            f"Unexpected {stray.group()!r} in the {what} {validate.describe(text.strip(), 60)}; "
            f"type sizes alone, for example {_EXAMPLES[what]}."
        )
    # "x" separates sizes only between digits ("8x4"), so "(8, x)" names the stray "x".
    parts = [p.strip() for p in re.split(r",|×|\*|(?<=\d)\s*x\s*(?=\d)", body)]
    if parts and parts[-1] == "" and len(parts) > 1:
        parts = parts[:-1]  # a trailing comma, as in "(8,)"
    if len(parts) > validate.MAX_AXES:
        raise SpecError(
            f"The {what} {text.strip()!r} has {len(parts)} sizes; use at most {validate.MAX_AXES}."
        )
    sizes = []
    for part in parts:
        if not part:
            raise SpecError(
                f"The {what} {validate.describe(text.strip(), 60)} has an empty size between "
                f"two separators; give one number each, for example {_EXAMPLES[what]}."
            )
        if re.fullmatch(r"[0-9]{13,}", part, re.ASCII):
            raise SpecError(
                f"The {what} has a size of {len(part)} digits, more than the book can use; keep "
                f"every size at most {validate.MAX_SIZE:,}."
            )
        if not _SIZE.fullmatch(part):
            fix = "use positive whole numbers"
            if any(ch.isnumeric() for ch in part) and not part.isascii():
                fix = "write sizes with the digits 0 to 9"
            raise SpecError(
                f"Could not read {validate.describe(part)} in the {what}; {fix}, for example "
                f"{_EXAMPLES[what]}."
            )
        sizes.append(int(part))
    if any(s == 0 for s in sizes):
        raise SpecError(f"The {what} {text.strip()!r} has a zero; every size must be at least 1.")
    for size in sizes:
        if size > validate.MAX_SIZE:
            raise SpecError(
                f"The {what} has a size of {size:,}, more than the book can use; keep every "
                f"size at most {validate.MAX_SIZE:,}."
            )
    return tuple(sizes)


@validate.impostors_refused
def parse_shape(text: str) -> tuple[int, ...]:
    """An array shape such as ``"(8, 4)"``, ``"8x4"`` or ``"16"``."""
    return _parse_sizes(text, "shape")


@validate.impostors_refused
def parse_mesh_shape(text: str) -> tuple[int, ...]:
    """A mesh shape such as ``"(2, 4)"``, ``"2x4"`` or ``"8"``."""
    return _parse_sizes(text, "mesh shape")


@validate.impostors_refused
def parse_axis_names(text: str) -> tuple[str, ...]:
    """Axis names such as ``"('data', 'model')"`` or ``"data, model"``."""
    text = _check_length(text, "axis names")
    body = text.strip()
    if body[:1] in "([" and body[-1:] in ")]":
        body = body[1:-1]
    names = [p.strip().strip("'\"") for p in body.split(",")]
    if len(names) > 1 and names[-1] == "":
        names = names[:-1]
    if len(names) > validate.MAX_AXES:
        raise SpecError(f"There are {len(names)} axis names; use at most {validate.MAX_AXES}.")
    for name in names:
        if not _NAME.match(name):
            raise _unusable_name(name)
    for name in names:
        if names.count(name) > 1:
            raise SpecError(
                f"The axis name {name!r} appears twice; give each mesh axis its own name."
            )
    return tuple(names)


def _unusable_name(name: str) -> SpecError:
    """The sentence for a quoted axis name that is not one, naming its first odd character."""
    odd = next((c for c in name if not (c.isascii() and (c.isalnum() or c == "_"))), None)
    why = f": it holds {odd!r} (U+{ord(odd):04X})" if odd is not None else ""
    why = why or (": it is longer than 64 characters" if len(name) > 64 else "")
    return SpecError(
        f"{validate.describe(name, 60)} is not a usable axis name{why}; use ASCII letters (a "
        "to z), digits and underscores, for example 'data'."
    )


def _tokens(text: str):
    pos = 0
    text = "".join(" " if c.isspace() else c for c in text).rstrip()  # pasted spaces too
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            bad = text[pos:].strip()[:1]
            raise SpecError(
                f"Unexpected {bad!r} in the partition spec; write names in quotes, None, or groups "
                "in parentheses, for example P(('data', 'model'), None)."
            )
        pos = m.end()
        if m.group("str"):
            yield "str", m.group("str")[1:-1]
        elif m.group("name"):
            yield "name", m.group("name")
        else:
            yield "punct", {"[": "(", "]": ")"}.get(m.group("punct"), m.group("punct"))


@validate.impostors_refused
def parse_partition_spec(text: str) -> P:
    """A partition spec such as ``"P('data', None)"``, ``"('data', 'model')"`` or ``"P()"``.

    Accepted forms: an optional ``P``/``PartitionSpec`` prefix, then entries that are an axis
    name (quoted or bare), ``None``, or a parenthesised group of names.
    """
    text = _check_length(text, "partition spec")
    toks = list(_tokens(text))
    if toks and toks[0] in (("name", "P"), ("name", "PartitionSpec")):
        if len(toks) < 2 or toks[1] != ("punct", "(") or toks[-1] != ("punct", ")"):
            raise SpecError("Write the spec as P(...), with its entries inside the parentheses.")
        toks = toks[2:-1]
    elif (
        len(toks) >= 2 and toks[0] == ("punct", "(") and toks[-1] == ("punct", ")") and _wraps(toks)
    ):
        toks = toks[1:-1]
    entries, i = [], 0
    while i < len(toks):
        entry, i = _entry(toks, i)
        entries.append(entry)
        if i < len(toks):
            if toks[i] != ("punct", ","):
                raise SpecError("Separate the spec's entries with commas, as in P('data', None).")
            i += 1
    return P(*entries)


def _wraps(toks) -> bool:
    """True when the first '(' closes at the last token, so it wraps the whole spec."""
    depth = 0
    for k, tok in enumerate(toks):
        depth += tok == ("punct", "(")
        depth -= tok == ("punct", ")")
        if depth == 0:
            return k == len(toks) - 1
    return False


def _name(tok):
    kind, value = tok
    if kind == "str" and _NAME.match(value):
        return value
    if kind == "name" and value not in ("None", "P", "PartitionSpec") and _NAME.match(value):
        return value
    return None


def _entry(toks, i):
    tok = toks[i]
    if tok == ("name", "None"):
        return None, i + 1
    if _name(tok) is not None:
        if i + 1 < len(toks) and toks[i + 1] == ("punct", "("):
            raise SpecError(
                f"{tok[1]}(...) is not allowed in a partition spec; use axis names, None, or "
                "groups of names in parentheses."
            )
        return _name(tok), i + 1
    if tok == ("punct", "("):
        names, i = [], i + 1
        while i < len(toks) and toks[i] != ("punct", ")"):
            name = _name(toks[i])
            if name is None and toks[i][0] == "str":
                raise _unusable_name(toks[i][1])
            if name is None:
                raise SpecError(
                    "A group in parentheses may hold only axis names, as in ('data', 'model')."
                )
            names.append(name)
            i += 1
            if i < len(toks) and toks[i] == ("punct", ","):
                i += 1
        if i >= len(toks):
            raise SpecError("A parenthesis in the partition spec is never closed; add the ')'.")
        return tuple(names) if len(names) != 1 else names[0], i + 1
    if tok[0] == "str":
        raise _unusable_name(tok[1])
    raise SpecError(
        f"Could not read {tok[1]!r} in the partition spec; write axis names in quotes, None, or "
        "groups in parentheses."
    )


def _axis_sizes(mesh) -> dict[str, int]:
    from jax.sharding import Mesh

    if isinstance(mesh, Mesh):
        return dict(mesh.shape)
    given, mesh = mesh, validate.plain_mapping(mesh)
    if not isinstance(mesh, dict):
        raise SpecError(
            "The mesh must be a jax.sharding.Mesh or a mapping from axis name to size, such as "
            f"{{'data': 2, 'model': 4}}, not {validate.describe(given)}."
        )
    if len(mesh) > validate.MAX_AXES:
        raise SpecError(f"The mesh has {len(mesh)} axes; use at most {validate.MAX_AXES}.")
    if not mesh:
        raise SpecError("The mesh has no axes; give it at least one, such as {'data': 8}.")
    return {
        validate.name(k, "Each mesh axis", error=SpecError): validate.whole(
            v, f"The size of mesh axis {k!r}", error=SpecError
        )
        for k, v in mesh.items()
    }


def _spec(spec) -> P:
    """A ``PartitionSpec`` (or its text) whose entries are names, None or groups of names."""
    if isinstance(spec, str):
        return parse_partition_spec(spec)
    if not isinstance(spec, P):
        raise SpecError(
            f"The spec must be a PartitionSpec such as P('data', None), not "
            f"{validate.describe(spec)}."
        )
    for entry in spec:
        group = entry if isinstance(entry, tuple) else (entry,)
        if entry is not None and not all(isinstance(n, str) for n in group):
            raise SpecError(
                f"The spec has the entry {validate.describe(entry)}; each entry is an axis name, "
                "None, or a tuple of axis names."
            )
    return spec


@validate.impostors_refused
def spec_text(spec: P) -> str:
    """A partition spec (or a tuple of its entries) as a reader writes it: ``P('data', None)``.

    Only a formatter: an entry that is no axis name is shown as ``describe`` shows it, so a
    message quoting a reader's odd spec never fails itself.
    """
    spec = validate.plain(spec)
    if not isinstance(spec, (P, tuple)):
        raise SpecError(
            f"The spec must be a PartitionSpec such as P('data', None), not "
            f"{validate.describe(spec)}."
        )

    def entry(e):
        if e is None or isinstance(e, str):
            return repr(e)
        if isinstance(e, tuple) and all(isinstance(n, str) for n in e):
            return repr(e)
        return validate.describe(e)

    return "P(" + ", ".join(entry(e) for e in spec) + ")"


@validate.impostors_refused
def names_text(names: Sequence[str]) -> str:
    """Axis names in a sentence: ``'data'``, ``'data' and 'model'``; ``no axes`` for none."""
    names = validate.plain(names)
    if isinstance(names, str) or not isinstance(names, (tuple, list)):
        raise SpecError(
            f"The axis names must be a tuple of names such as ('data', 'model'), not "
            f"{validate.describe(names)}."
        )
    quoted = [validate.describe(n) for n in names]
    if not quoted:
        return "no axes"
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


@validate.impostors_refused
def check_mesh(mesh_shape: Sequence[int], axis_names: Sequence[str], device_count: int) -> None:
    """A mesh must have one name per axis and at most as many devices as there are.

    A smaller mesh is allowed, as ``jax.make_mesh`` allows it: it takes the first devices.
    """
    mesh_shape = validate.sizes(mesh_shape, "The mesh shape", error=SpecError)
    axis_names = validate.plain(axis_names)
    if isinstance(axis_names, str) or not isinstance(axis_names, (tuple, list)):
        raise SpecError(
            f"The axis names must be a tuple of names such as ('data', 'model'), not "
            f"{validate.describe(axis_names)}."
        )
    axis_names = [validate.name(n, "Each axis name", error=SpecError) for n in axis_names]
    for name in axis_names:
        if axis_names.count(name) > 1:
            raise SpecError(
                f"The axis name {name!r} appears twice; give each mesh axis its own name."
            )
    device_count = validate.whole(
        device_count, "The device count", high=validate.MAX_DEVICES, error=SpecError
    )
    if len(mesh_shape) != len(axis_names):
        raise SpecError(
            f"The mesh shape {tuple(mesh_shape)} has {len(mesh_shape)} axes but "
            f"{len(axis_names)} names were given; give one name per axis."
        )
    size = math.prod(mesh_shape)
    if size > device_count:
        shape = "x".join(map(str, mesh_shape))
        raise SpecError(
            f"A {shape} mesh needs {size:,} devices but there are {device_count}; choose sizes "
            f"whose product is at most {device_count}."
        )


@validate.impostors_refused
def check_sharding(array_shape: Sequence[int], mesh, spec: P) -> None:
    """Check that ``spec`` can shard an array of ``array_shape`` over ``mesh``.

    ``mesh`` is a ``jax.sharding.Mesh`` or a mapping from axis name to size, ``spec`` a
    ``PartitionSpec`` or its text. The checks mirror what JAX rejects, but each failure names
    the fix in one sentence.
    """
    array_shape = validate.sizes(array_shape, "The array shape", low=0, error=SpecError)
    spec = _spec(spec)
    sizes = _axis_sizes(mesh)
    if len(spec) > len(array_shape):
        raise SpecError(
            f"{spec_text(spec)} has {len(spec)} entries but the array has rank "
            f"{len(array_shape)}; use at most {len(array_shape)} entries."
        )
    seen = set()
    for entry in spec:
        for name in (entry,) if isinstance(entry, str) else (entry or ()):
            if name not in sizes:
                raise SpecError(
                    f"Axis {name!r} is not in the mesh, whose axes are {names_text(list(sizes))}; "
                    "use one of those names."
                )
            if name in seen:
                raise SpecError(
                    f"Axis {name!r} is used twice in {spec_text(spec)}; a mesh axis can shard "
                    "only one array dimension."
                )
            seen.add(name)
    for dim, (length, entry) in enumerate(zip(array_shape, spec)):
        names = (entry,) if isinstance(entry, str) else (entry or ())
        ways = math.prod(sizes[n] for n in names)
        if length % ways:
            over = " x ".join(f"{n}={sizes[n]}" for n in names)
            raise SpecError(
                f"Dimension {dim} has size {length}, which the {ways} devices of {over} cannot "
                f"split evenly; use a size divisible by {ways} or shard it differently."
            )
