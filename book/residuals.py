"""What autodiff keeps for the backward pass, as data: ``print_saved_residuals``, read back.

``jax.ad_checkpoint`` exports ``print_saved_residuals`` but not the list it prints (that lives
in ``jax._src``), so this module reads the printout. Each line is one residual: its type first,
``f32[512,16]{V:data}``, then where it came from, such as ``output of all_gather from
file.py:12:8 (ag)``, ``named 'gathered' from ...``, ``from the argument ...`` or ``from a
constant``. The type gives the shape and the bytes; the source is kept as printed, less the file
and line, so that a chapter can show it.

``name_p``, the primitive ``checkpoint_name`` binds, is here for remat policies that refuse a
name: ``jax.ad_checkpoint`` exports it from jax 0.12 on, older versions only in ``jax._src``.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
from dataclasses import dataclass

from jax.ad_checkpoint import print_saved_residuals

try:
    from jax.ad_checkpoint import name_p as name_p
except ImportError:  # jax older than 0.12
    from jax._src.ad_checkpoint import name_p as name_p

from book import validate
from book.errors import ReaderError

# A dimension, and the mesh axes that split it where the argument has an explicit sharding:
# f32[8@x,4], f32[8@(a,b),8].
# Axis names may hold spaces and run long (any text JAX accepts but these separators).
_DIM = r"\d{1,20}(?:@(?:[^,()\[\]@]{1,1000}|\([^()\[\]@]{1,4000}\)))?"
_TYPE = re.compile(
    rf"(bool|bf16|[fiuc]\d{{1,3}}(?:_[a-z0-9]{{1,12}})?)\[((?:{_DIM}(?:,{_DIM})*)?)\]"
    r"(?:\{[^{}]{0,4000}\})?",  # what varies over shard_map's axes: {V:data}
    re.ASCII,
)
# How print_saved_residuals says where each residual came from (jax/_src/ad_checkpoint.py):
# a line that does not say so is the traced function's own print.
_SOURCES = ("from a literal", "from a constant", "from the argument", "named '", "output of ")
_PLACE = r"\S+:\d+(?::\d+)? \(([^()]*)\)"  # file:line:col (function)
_WHERE = re.compile(rf" from {_PLACE}$")  # the last place, where a name holds one too
# A named residual's line ends where the name's quote closes, then where it was named (or
# "unknown", or nothing, where JAX found no frame of the reader's).
_NAMED_LINE = re.compile(rf"named '.*' from (?:{_PLACE}|unknown)?")
_KINDS = {"f": "float", "i": "int", "u": "uint", "c": "complex"}


@dataclass(frozen=True)
class Residual:
    """One array autodiff saves: its type as printed, shape, dtype, and what made it.

    Where the type names mesh axes (``f32[16@x]``, an explicitly sharded array split over
    ``x``), ``shape`` and ``nbytes`` are the whole array's, not one device's block.
    """

    type_text: str
    shape: tuple[int, ...]
    dtype: str
    source: str

    @property
    def nbytes(self) -> int:
        bits = 8 if self.dtype == "bool" else int(re.match(r"\D*(\d+)", self.dtype).group(1))
        return -(-math.prod(self.shape) * bits // 8)  # packed, rounded up to a whole byte

    def __str__(self) -> str:
        return f"{self.type_text} {self.source}"


def _dtype(short: str) -> str:
    if short in ("bool", "bf16"):
        return {"bool": "bool", "bf16": "bfloat16"}[short]
    return _KINDS[short[0]] + short[1:]


@validate.impostors_refused
def parse(text: str) -> list[Residual]:
    """The residuals in a printout of ``print_saved_residuals``, one per line, in its order."""
    text = validate.text(
        text, "the printout", example="'f32[512,16] from the argument x'", limit=2**31, empty=True
    )
    found = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _TYPE.match(line)
        if m is None:
            raise ReaderError(
                f"{line[:60]!r} does not start with an array type such as f32[512,16]; pass "
                "the text print_saved_residuals printed."
            )
        type_text, source = m.group(0), line[m.end() :].lstrip(" ")
        dims = tuple(int(d) for d in re.findall(r"(?:^|,)(\d+)", m.group(2)))
        source = _WHERE.sub(r" in \1", source)
        source = re.sub(r" from\s*$", "", source)  # JAX found no frame of the reader's
        found.append(Residual(type_text, dims, _dtype(m.group(1)), source))
    return found


@validate.impostors_refused
def saved(f, *args) -> list[Residual]:
    """What autodiff saves of ``f(*args)`` to differentiate it with respect to ``args``.

    It only traces ``f``. Called while ``shard_map`` traces its body, it lists one device's
    residuals, with the shapes of one device's blocks.
    """
    validate.callable_(f, "f")
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            print_saved_residuals(f, *args)
    except TypeError:  # an argument JAX cannot trace, such as a string
        raise ReaderError(
            "print_saved_residuals could not trace f with these arguments; pass arrays, as "
            "jax.grad would take them."
        ) from None
    # What f printed itself, while traced, goes back to the reader; the residuals are parsed.
    lines = printed.getvalue().splitlines()
    kept = [line for line in lines if _residual_line(line)]
    for line in kept:
        source = line[_TYPE.match(line).end() + 1 :]
        if source.startswith("named '") and not _NAMED_LINE.fullmatch(source):
            raise ReaderError(
                f"A checkpoint_name holds a line break ({source[:60]!r}...), which "
                "print_saved_residuals' printout cannot carry; give the name on one line."
            )
    own = [line for line in lines if line.strip() and not _residual_line(line)]
    if own:
        print("\n".join(own))
    return parse("\n".join(kept))


def _residual_line(line: str) -> bool:
    """Whether a printed line is print_saved_residuals' own: a type, then where it came from."""
    m = _TYPE.match(line)
    return m is not None and line[m.end() :].startswith(tuple(" " + s for s in _SOURCES))


@validate.impostors_refused
def total_bytes(residuals) -> int:
    """The bytes of a list of residuals together."""
    residuals = validate.plain(residuals)
    if not isinstance(residuals, (list, tuple)) or not all(
        isinstance(r, Residual) for r in residuals
    ):
        raise ReaderError(
            "Pass a list of residuals, such as book.residuals.saved returns, not "
            f"{validate.describe(residuals)}."
        )
    return sum(r.nbytes for r in residuals)
