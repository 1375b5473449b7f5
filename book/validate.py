"""Check what a reader passes to the book's functions, and refuse the rest in one sentence.

Every public function of ``book`` runs its arguments through these checks before it does any
work, so a wrong kind of thing, a size no machine could hold or a number that is not what it
looks like ends as a ``ReaderError`` whose message is one sentence saying what to pass instead.
Nothing a reader types is evaluated: text becomes a number only when it is made of the ASCII
digits 0 to 9 (``'²'`` and ``'①'`` look like digits to ``str.isdigit`` but are refused here), and
a message never prints a value it cannot print quickly (``10**10000`` is named by its length).
"""

from __future__ import annotations

import decimal
import fractions
import functools
import itertools
import math
import numbers
import os
import re
import re._constants as _re_constants
import re._parser as _re_parser
import unicodedata
from collections.abc import Mapping, Sequence

import numpy as np

from book.errors import ReaderError

MAX_SIZE = 2**31 - 1  # the largest size or count the book takes (an int32 dimension)
MAX_DEVICES = 16384  # more devices than any machine JAX runs on has
MAX_AXES = 8  # mesh axes and array dimensions a reader can type
MAX_SECONDS = 3600.0  # the longest the book waits for anything
MAX_TEXT = 200  # the longest text a reader types into a form
_POSSESSIVE = getattr(_re_constants, "POSSESSIVE_REPEAT", None)
_DIGITS = re.compile(r"[+-]?[0-9]{1,19}", re.ASCII)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}", re.ASCII)
_WORKER_BYTES = 300 * 2**20  # what one JAX worker process needs, roughly


class BadValue(ReaderError, ValueError):
    """A value of the right kind that cannot work, such as a ring of no devices."""


class WrongKind(ReaderError, TypeError):
    """A wrong kind of thing passed where the book needs another, such as a NumPy array for a
    ``jax.Array`` or a function for its compiled program."""


def _seconds_text(value) -> str:
    """A count of seconds as a sentence says it: '7200 seconds', 'a number of seconds with
    about 31 digits'."""
    text = describe(value)
    if text.startswith("a number with"):
        return text.replace("a number with", "a number of seconds with", 1)
    return f"{text} seconds"


def describe(value, limit: int = 40, _depth: int = 0) -> str:
    """``value`` as a message can quote it: short, on one line, and never an error of its own.

    Numbers and short texts are shown as they are; a huge integer by its number of digits
    (``str`` refuses integers of more than 4300 digits); anything else by its type, since its
    own ``repr`` could be long, slow or fail. Short lists and tuples are shown with their
    items, two levels deep at most, so a list that holds itself is named, not followed forever.
    A value whose own conversions fail (a subclass of ``int`` whose ``__int__`` raises) is
    named by its type.
    """
    try:
        return _describe(value, limit, _depth)
    except Exception:  # noqa: BLE001 - describing must never be an error of its own
        return kind(value)


def _describe(value, limit: int, _depth: int) -> str:
    if value is None or isinstance(value, (bool, np.bool_)):
        return repr(None if value is None else bool(value))
    if isinstance(value, (np.timedelta64, np.datetime64)):
        return f"a {type(value).__name__}"  # not its integer: a duration is no count
    if isinstance(value, np.ma.MaskedArray) and np.ma.is_masked(value):
        return "a masked value"
    if isinstance(value, (int, np.integer)):
        number = int(value)
        if number.bit_length() <= 64:
            return str(number)
        digits = int(number.bit_length() * math.log10(2)) + 1
        return f"a {'negative ' if number < 0 else ''}number with about {digits:,} digits"
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, str):
        text = str.__str__(value)
        return repr(text if len(text) <= limit else text[:limit] + "…")
    if isinstance(value, (tuple, list)) and len(value) <= 8 and _depth < 2:
        parts = [describe(v, limit, _depth + 1) for v in value]
        if all(not p.startswith(("a ", "an ")) for p in parts):
            inner = ", ".join(parts) + ("," if len(parts) == 1 and isinstance(value, tuple) else "")
            shown = f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
            if len(shown) <= 2 * limit:
                return shown
    return kind(value)


def kind(value) -> str:
    """The type of ``value`` with its article: ``a list``, ``an ndarray``."""
    if isinstance(value, np.ndarray):
        return "a NumPy array"
    if type(value).__module__.split(".")[0] in ("jax", "jaxlib") and hasattr(value, "dtype"):
        try:  # a JAX array: its dtype says more than ArrayImpl
            if value.is_deleted():
                return "a deleted JAX array"
            return f"a JAX array of {value.dtype}"
        except Exception:  # noqa: BLE001 - a tracer, or an array whose methods fail
            pass
    name = type(value).__name__
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def impostors_refused(function):
    """Wrap a reader-facing ``function``: an argument that lies about its type gets one sentence.

    An object whose ``__class__`` names a type it is not, or whose attributes all raise, passes
    ``isinstance`` checks it should fail or makes them raise, and then breaks deep inside the
    function. Nothing is checked on the way in, so a call costs nothing more; only when the
    call raises something other than a ``ReaderError`` are its arguments (and what lists,
    tuples, sets and dicts hold, to a few levels) searched for such an object, and the error
    becomes a ``WrongKind`` naming it. Any other error is the book's own and escapes as it is.
    """

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except ReaderError:
            raise
        except Exception:
            impostor = _impostor([*args, *kwargs.values()])
            if impostor is None:
                raise
            raise WrongKind(
                f"{function.__name__} was given {impostor}; pass plain Python or NumPy values "
                "and JAX objects."
            ) from None

    return wrapper


_CONTAINERS = (list, tuple, set, frozenset)


def _impostor(values, depth: int = 0, budget: list | None = None) -> str | None:
    """How to name the first object among ``values`` that misreports its type, or None.

    Reads types with ``type()``, which an object cannot fake, and items with the built-in
    types' own methods; follows dicts, lists, tuples and sets four levels deep and 10,000
    items in all.
    """
    budget = [10_000] if budget is None else budget
    for value in values:
        budget[0] -= 1
        if budget[0] < 0:
            return None
        real = type(value)
        try:
            claimed = value.__class__
        except Exception:  # noqa: BLE001 - the very thing looked for
            return f"an object whose attributes cannot be read (a {real.__name__})"
        if claimed is not real:
            name = claimed.__name__ if issubclass(type(claimed), type) else "something else"
            return f"an object that claims to be a {name} but is a {real.__name__}"
        if depth >= 4:
            continue
        try:
            if issubclass(real, dict):
                items = [*dict.keys(value), *dict.values(value)]
            elif issubclass(real, _CONTAINERS):
                base = next(b for b in _CONTAINERS if issubclass(real, b))
                items = list(itertools.islice(base.__iter__(value), budget[0] + 1))
            else:
                continue
        except Exception:  # noqa: BLE001 - a container whose items cannot be read
            return f"a {real.__name__} whose items cannot be read"
        found = _impostor(items, depth + 1, budget)
        if found:
            return found
    return None


def plain(value):
    """A subclass of ``str``, ``int``, ``float``, ``list``, ``tuple`` or ``dict`` as that type.

    Read with the built-in type's own methods, so a subclass whose ``__len__``, ``__iter__``,
    ``strip`` or ``__eq__`` fails (or lies) is read for what it holds, and the checks below
    never call the reader's methods. Anything else (``bool``, NumPy values, other objects) is
    returned as it is.
    """
    for base, read in _PLAIN:
        if isinstance(value, base) and type(value) is not base and not isinstance(value, bool):
            try:
                return read(value)
            except Exception:  # noqa: BLE001 - a dict whose items cannot be read: as it is
                return value
    return value


def plain_mapping(value):
    """``plain(value)``, with a mapping of the reader's own class read once into a ``dict``.

    Read by its ``items()`` only, so the checks that follow never call its methods again; a
    mapping whose own methods fail gives None, which every caller refuses in one sentence.
    """
    value = plain(value)
    if isinstance(value, Mapping) and not isinstance(value, dict):
        try:
            return dict(value.items())
        except Exception:  # noqa: BLE001 - its own methods fail
            return None
    return value


_PLAIN = (
    (str, str.__str__),
    (int, int.__int__),
    (float, float.__float__),
    (list, list.copy),
    (tuple, lambda value: tuple.__getitem__(value, slice(None))),
    (dict, lambda value: dict(dict.items(value))),
)


def _is_text(value) -> bool:
    """A string or a subclass; not an object whose ``__class__`` claims ``str`` to isinstance."""
    return issubclass(type(value), str)


def _is_whole(value) -> bool:
    kind = type(value)  # not isinstance: an object's __class__ property may claim int
    not_counts = (bool, np.bool_, np.timedelta64)  # NumPy's durations are integers too
    return issubclass(kind, (int, np.integer)) and not issubclass(kind, not_counts)


def scalar(value):
    """A 0-d NumPy or JAX array as the Python number it holds; anything else as it is.

    ``jnp.sum(x)``, ``x.shape[0] * jnp.int32(2)`` and NumPy's reductions give 0-d arrays, and
    a reader who computes a size or a count that way has given a number. A traced value has
    no number yet and stays as it is, to be refused by kind.
    """
    is_array = isinstance(value, (np.ndarray, np.generic)) or type(value).__module__.split(".")[
        0
    ] in ("jax", "jaxlib")
    if getattr(getattr(value, "dtype", None), "kind", None) in ("m", "M"):
        return value  # a duration or a date holds no count, whatever its integer
    if isinstance(value, np.ma.MaskedArray) and np.ma.is_masked(value):
        return value  # a masked value holds no number, whatever lies under the mask
    if is_array and getattr(value, "shape", None) == ():
        try:
            return value.item()
        except Exception:  # noqa: BLE001 - a tracer, or an array of objects
            return value
    return value


def widened(array: np.ndarray) -> np.ndarray:
    """A bfloat16, float8 or int4 array as float32 or int64; any other as it is.

    ml_dtypes' types, which JAX's arrays use, are of NumPy's kind "V" (raw bytes), so a check
    by kind ("biuf") would take them for no numbers.
    """
    if array.dtype.type.__module__ == "ml_dtypes":
        return array.astype(np.int64 if "int" in array.dtype.name else np.float32)
    return array


def number(
    value,
    name: str,
    *,
    low: float = 0.0,
    above: bool = False,
    high: float = math.inf,
    wanted: str = "a number such as 1.5",
    error: type[ReaderError] = ReaderError,
) -> float:
    """``value`` as a finite ``float`` of at least ``low`` (above it with ``above``).

    Python and NumPy numbers, fractions and 0-d arrays are taken; ``True`` is refused, and so
    are ``nan`` (every comparison with it is false, so it would pass any bound silently),
    infinities and integers too large for a float (``10**400``).
    """
    value = scalar(value)
    real = isinstance(value, (numbers.Real, np.floating, np.integer))
    dated = isinstance(value, (np.timedelta64, np.datetime64))  # NumPy's integers, no counts
    if not real or dated or isinstance(value, (bool, np.bool_)):
        shown = describe(value) + (" (a string)" if isinstance(value, str) else "")
        raise error(f"{name} must be {wanted}, not {shown}.")
    try:
        result = float(value)
    except OverflowError:
        raise error(
            f"{name} is too large: {describe(value)} is more than a float can hold."
        ) from None
    except Exception:  # noqa: BLE001 - a number subclass whose own conversion fails
        raise error(f"{name} must be {wanted}, not {describe(value)}.") from None
    if not math.isfinite(result):
        raise error(f"{name} must be a finite number, not {describe(value)}.")
    if result < low or (above and result == low):
        bound = f"more than {low:g}" if above else f"at least {low:g}"
        raise error(f"{name} must be {bound}, not {describe(value)}.")
    if result > high:
        raise error(f"{name} is too large: {describe(value)}; use at most {high:g}.")
    return result


def whole(
    value,
    name: str,
    *,
    low: int = 1,
    high: int = MAX_SIZE,
    text: bool = False,
    example: int | None = None,
    too_large: str = "more than the book can use",
    error: type[ReaderError] = ReaderError,
) -> int:
    """``value`` as an ``int`` between ``low`` and ``high``, or ``error`` in one sentence.

    Python and NumPy integers are accepted; ``True`` is refused although Python counts it as 1,
    and so is ``8.0``. With ``text``, a string of the digits 0 to 9 (and a sign) is read too,
    as forms pass what a reader types.
    """
    example = max(low, min(8, high)) if example is None else example
    sort = "a positive whole number" if low == 1 else "a whole number"
    wanted = f"{name} must be {sort} such as {example}"
    value = scalar(value)
    if _is_text(value) and text:
        body = str.__str__(value).strip()  # the text itself, whatever a subclass redefines
        # Leading zeros add no size: "0008" is 8 (the sign kept in front).
        body = re.sub(r"^([+-]?)0+(?=[0-9])", r"\1", body, flags=re.ASCII)
        if not _DIGITS.fullmatch(body):
            if re.fullmatch(r"[+-]?[0-9]+", body, re.ASCII):
                raise error(
                    f"{name} is too large: {describe(value)} has {len(body)} digits; "
                    f"use at most {high:,}."
                )
            hint = ""
            if any(ch.isnumeric() for ch in body) and not body.isascii():
                hint = ", typed with the digits 0 to 9"
            raise error(f"{wanted}{hint}, not {describe(value)}.")
        value = int(body)
    if type(value) is fractions.Fraction and value.denominator == 1:  # exact, unlike 8.0
        value = value.numerator
    if not _is_whole(value):
        shown = describe(value)
        if isinstance(value, str):
            shown += " (a string)"
        raise error(f"{wanted}, not {shown}.")
    try:
        number = int(value)
    except Exception:  # noqa: BLE001 - an integer subclass whose own conversion fails
        raise error(f"{wanted}, not {describe(value)}.") from None
    if number < low:
        if low == 1:
            raise error(f"{wanted}, not {describe(number)}.")
        raise error(f"{name} must be at least {low:,}, not {describe(number)}.")
    if number > high:
        raise error(
            f"{name} is too large: {describe(number)} is {too_large}; use at most {high:,}."
        )
    return number


def seconds(
    value, name: str, *, high: float = MAX_SECONDS, error: type[ReaderError] = ReaderError
) -> float:
    """A time limit in seconds: a finite number above zero and at most ``high``.

    ``nan`` would switch a limit off (every comparison with it is false) and ``inf`` never
    comes, so both are refused like zero and negative numbers.
    """
    given, value = value, plain(scalar(value))
    wanted = f"{name} must be a number of seconds such as 60, not {describe(given)}."
    if isinstance(value, (bool, np.bool_, np.timedelta64)) or not isinstance(
        value, (numbers.Real, np.integer, np.floating, decimal.Decimal)
    ):
        raise error(wanted)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    except Exception:  # noqa: BLE001 - a NumPy number whose own conversion fails
        raise error(wanted) from None
    if math.isnan(number):
        raise error(f"{name} must be a number of seconds such as 60, not nan.")
    if number <= 0:
        raise error(f"{name} must be more than 0 seconds, not {describe(value)}.")
    if number > high:
        raise error(
            f"{name} is {_seconds_text(value)}, longer than the book ever waits; use at "
            f"most {high:g}."
        )
    return number


def flag(value, name: str, *, error: type[ReaderError] = ReaderError) -> bool:
    """``True`` or ``False`` (a NumPy bool too); the text ``'False'`` is refused."""
    value = scalar(value)  # np.array(True) too
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    shown = describe(value) + (" (a string)" if isinstance(value, str) else "")
    raise error(f"{name} must be True or False, not {shown}.")


def text(
    value,
    name: str,
    *,
    example: str,
    limit: int = MAX_TEXT,
    empty: bool = False,
    error: type[ReaderError] = ReaderError,
) -> str:
    """A string of at most ``limit`` characters (not empty unless ``empty``).

    A lone surrogate (``'\\udcff'``, what Python makes of bytes that are not UTF-8) is refused:
    it is no character, and a page or a plot fails on it.
    """
    if not _is_text(value):
        raise error(f"Type {name} as text, such as {example}, not {describe(value)}.")
    value = plain(value)
    called = name[:1].upper() + name[1:]
    if len(value) > limit:
        raise error(f"{called} is too long; keep it under {limit} characters.")
    if not empty and not value.strip():
        blank = "empty" if not value else "only whitespace"
        raise error(f"{called} is {blank}; type one, such as {example}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise error(f"{called} holds a character that is not text; type it again.") from None
    return value


def encodable(value: str) -> bool:
    """Whether a text can be handed to another program: a lone surrogate such as ``'\\ud800'``
    cannot (those that stand for bytes of a file name can, as ``os.fsencode`` writes them)."""
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        return False
    return True


def optional_text(value, name: str, *, example: str, error: type[ReaderError] = ReaderError):
    """``None`` or a short text, such as a title."""
    return None if value is None else text(value, name, example=example, empty=True, error=error)


def name(value, what: str, *, error: type[ReaderError] = ReaderError) -> str:
    """An identifier such as ``'data'``: ASCII letters, digits and underscores, at most 64."""
    if not _is_text(value) or not _NAME.fullmatch(str.__str__(value)):
        raise error(
            f"{what} must be a name of ASCII letters (a to z), digits and underscores such as "
            f"'data', not {describe(value)}."
        )
    return str.__str__(value)


def path(value, what: str, example: str, *, error: type[ReaderError] = ReaderError):
    """A path as ``str`` or ``pathlib.Path``; anything else refused before ``pathlib`` sees it."""
    from pathlib import Path

    try:
        text = os.fspath(value) if isinstance(value, os.PathLike) else value
    except Exception:  # noqa: BLE001 - a path object of the reader's whose __fspath__ fails
        text = None
    text = plain(text)
    if not isinstance(text, str) or not text.strip():
        raise error(
            f"{what} must be a path, a str or pathlib.Path naming {example}, not {describe(value)}."
        )
    if "\0" in text:
        raise error(f"{what} holds a NUL character, which no path can; check the path.")
    local(text, what, error=error)
    try:
        return Path(text).expanduser()  # ~/runs: the home folder's, as a shell reads it
    except (RuntimeError, UnicodeError):  # ~nobody: no such user (or no name a user has)
        raise error(f"{what} names a home folder that does not exist: {describe(text)}.") from None


def local(text: str, what: str, *, error: type[ReaderError] = ReaderError) -> str:
    """``text`` unless it is a URL such as gs://b or s3:/b, which names no local path (blank
    and invisible characters before it included)."""
    if not isinstance(text, str):
        raise error(f"{what} must be a path as text, not {describe(text)}.")
    shown = text
    text = "".join(c for c in text if unicodedata.category(c) != "Cf").strip()
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]+:/", text):  # not C:/, a drive
        raise error(f"{what} is a URL, {describe(shown)}; give a local path (mount it first).")
    return shown


def matches_newline(regex) -> bool:
    """Whether a compiled pattern needs a newline, which no single line holds: one written in
    any form (\\n, \\x0a, \\012, \\N{LINE FEED}, a class of nothing else), or one a lookaround,
    an atomic group or both arms of a conditional need."""
    c = _re_constants

    def only_newline(items) -> bool:
        return bool(items) and all(
            (op is c.LITERAL and arg == 10) or (op is c.RANGE and arg == (10, 10))
            for op, arg in items
        )

    def needs(parsed) -> bool:
        for op, arg in parsed:
            if (op is c.LITERAL and arg == 10) or (op is c.IN and only_newline(arg)):
                return True
            if op is c.SUBPATTERN or op is c.ASSERT:  # a group, or a lookahead or lookbehind
                if needs(arg[-1]):
                    return True
            if op is c.ATOMIC_GROUP and needs(arg):
                return True
            if op in (c.MAX_REPEAT, c.MIN_REPEAT, _POSSESSIVE):
                if arg[0] > 0 and needs(arg[2]):
                    return True
            if op is c.BRANCH and all(needs(b) for b in arg[1]):
                return True
            if op is c.GROUPREF_EXISTS and arg[2] is not None:  # (?(1)yes|no)
                if needs(arg[1]) and needs(arg[2]):
                    return True
        return False

    return needs(_re_parser.parse(regex.pattern, regex.flags))


def choice(value, options: Sequence[str], what: str, *, error: type[ReaderError] = ReaderError):
    """One of ``options`` (strings), compared as text: a list or an unhashable value is refused."""
    if _is_text(value) and str.__str__(value) in options:
        return str.__str__(value)
    listed = ", ".join(options[:-1]) + " or " + options[-1] if len(options) > 1 else options[0]
    raise error(f"{describe(value)} is not {what} here; pick one of {listed}.")


def sizes(
    value,
    what: str,
    *,
    max_rank: int = MAX_AXES,
    low: int = 1,
    error: type[ReaderError] = ReaderError,
) -> tuple[int, ...]:
    """A shape given as numbers: a tuple or list of whole numbers, at most ``max_rank`` of them."""
    value = plain(value)
    if not isinstance(value, (tuple, list)):
        raise error(f"{what} must be a tuple of whole numbers such as (8, 4), not {kind(value)}.")
    if len(value) > max_rank:
        raise error(f"{what} has {len(value)} entries; use at most {max_rank}.")
    entry = f"Each entry of {what[:1].lower()}{what[1:]}"
    return tuple(whole(v, entry, low=low, error=error) for v in value)


def slices(value, what: str, *, error: type[ReaderError] = ReaderError) -> tuple[slice, ...]:
    """A tuple of slices, such as ``jax.make_array_from_callback`` passes: each bound a whole
    number or None, and no step of 0."""
    value = plain(value)
    if not isinstance(value, (tuple, list)) or not all(isinstance(i, slice) for i in value):
        given = describe(value)
        if isinstance(value, (tuple, list)):
            given = f"one holding {describe(next(i for i in value if not isinstance(i, slice)))}"
        raise error(
            f"{what} must be a tuple of slices, one per dimension, such as (slice(0, 4),), not "
            f"{given}."
        )
    for i in value:
        for bound in (i.start, i.stop, i.step):
            if bound is not None and not _is_whole(bound):
                raise error(
                    f"{what} has a slice bound {describe(bound)}; use whole numbers or None."
                )
            if bound is not None and abs(int(bound)) > 2**62:
                raise error(f"{what} has a slice bound too large for any array.")
        if i.step is not None and int(i.step) == 0:
            raise error(f"{what} has a slice step of 0; use 1, or leave it out.")
    return tuple(value)


def signal_of(value, what: str = "sig", *, error: type[ReaderError] = ReaderError):
    """A signal such as ``signal.SIGTERM``, its number, or its name (``'SIGTERM'``, ``'term'``)."""
    import signal

    if isinstance(value, signal.Signals):
        return value
    number = plain(scalar(value))
    if _is_whole(number) and int(number) in {s.value for s in signal.Signals}:
        return signal.Signals(int(number))
    if _is_text(number) and len(number) <= 20:
        name = number.strip().upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if name in signal.Signals.__members__:
            return signal.Signals[name]
    raise error(f"{what} must be a signal such as signal.SIGTERM, not {describe(value)}.")


def pattern(value, what: str = "the pattern", *, error: type[ReaderError] = ReaderError):
    """A regular expression, compiled to match within lines (``re.M``).

    Python's ``re`` cannot be interrupted, and a repeat around another repeat or around
    alternatives, such as ``(a+)+`` or ``(a|aa)+``, can take exponential time on a line that
    almost matches: such patterns are refused, so that a search of a program's output ends.
    """
    found = text(value, what, example="r'step (\\d+)'", limit=1000, error=error)
    try:
        compiled = re.compile(found, re.M)
        nested = _nested_repeat(_re_parser.parse(found, re.M))
    except (re.error, RecursionError, OverflowError) as err:
        why = getattr(err, "msg", None) or type(err).__name__
        raise error(
            f"{what[:1].upper()}{what[1:]} is no regular expression Python reads ({why}); fix "
            "it, or pass re.escape(text) to match text as it is."
        ) from None
    if nested:
        raise error(
            f"{what[:1].upper()}{what[1:]} repeats a group that itself repeats or has "
            "alternatives, such as (a+)+, which can search for hours; repeat single characters "
            "or classes only, such as r'step (\\d+)'."
        )
    return compiled


def _nested_repeat(parsed, inside: bool = False) -> bool:
    """Whether a parsed pattern has a repeat (of more than one) around a repeat or a branch."""
    for op, arg in parsed:
        if op in (_re_constants.MAX_REPEAT, _re_constants.MIN_REPEAT, _POSSESSIVE):
            low, high, body = arg
            repeats = high is _re_constants.MAXREPEAT or high > 1
            if (inside and repeats) or _nested_repeat(body, inside or repeats):
                return True
        elif op is _re_constants.BRANCH:
            if inside or any(_nested_repeat(b, inside) for b in arg[1]):
                return True
        elif op is _re_constants.SUBPATTERN:
            if _nested_repeat(arg[-1], inside):
                return True
        elif op in (_re_constants.ASSERT, _re_constants.ASSERT_NOT):
            if _nested_repeat(arg[1], inside):
                return True
    return False


def callable_(value, what: str, *, error: type[ReaderError] = ReaderError):
    """A function (anything callable)."""
    if not callable(value):
        raise error(f"{what} must be a function, not {describe(value)}.")
    return value


def max_processes() -> int:
    """How many JAX processes this machine can run at once: 4 per core, 300 MB of memory each.

    A JAX process on CPU starts a backend of its own; beyond this many they only wait for each
    other's cores or run the machine out of memory.
    """
    by_cores = 4 * (os.cpu_count() or 1)
    memory = _available_memory()
    by_memory = memory // _WORKER_BYTES if memory else by_cores
    return max(2, min(64, by_cores, by_memory))


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def processes(value, name: str, *, error: type[ReaderError] = ReaderError) -> int:
    """A number of processes to start: at least 1, at most what ``max_processes`` allows."""
    most = max_processes()
    return whole(
        value,
        name,
        high=most,
        example=2,
        too_large=f"more processes than this machine can run at once ({most})",
        error=error,
    )


def array(value, what: str, *, keys: bool = False, error: type[ReaderError] = WrongKind):
    """A concrete ``jax.Array`` (not a NumPy array, and not a traced value inside ``jit``).

    Not one already deleted (donated to a jitted function) either, since none of its values
    can be read; PRNG keys only with ``keys``, since theirs are no numbers to show.
    """
    import jax

    if isinstance(value, jax.core.Tracer):
        raise error(
            f"{what} is a traced value inside a transformed function; call this outside jit, "
            "on the array the function returns."
        )
    if not isinstance(value, jax.Array):
        hint = ", placed with jax.device_put" if isinstance(value, np.ndarray) else ""
        raise error(f"{what} must be a jax.Array{hint}, not {describe(value)}.")
    if value.is_deleted():
        raise error(
            f"{what} has been deleted, as an array donated to a jitted function is; pass one "
            "still alive, such as that function's result."
        )
    if not keys and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        raise error(
            f"{what} holds PRNG keys, which are no numbers; pass jax.random.key_data of it."
        )
    return value


def mesh(value, what: str = "mesh", *, error: type[ReaderError] = WrongKind):
    """A ``jax.sharding.Mesh``, such as ``jax.make_mesh`` returns."""
    from jax.sharding import Mesh

    if not isinstance(value, Mesh):
        raise error(
            f"{what} must be a jax.sharding.Mesh such as jax.make_mesh returns, not "
            f"{describe(value)}."
        )
    return value


def compiled(value, what: str = "This", *, error: type[ReaderError] = WrongKind):
    """A compiled program (``jax.jit(f).lower(*args).compile()``) or its text."""
    import jax

    if isinstance(value, (str, jax.stages.Compiled)):
        return plain(value)
    if isinstance(value, jax.stages.Lowered):
        raise error(
            f"{what} is a lowered program, not a compiled one; pass the result of .compile() "
            "so the collectives the compiler inserts are there."
        )
    if hasattr(value, "lower") and callable(value):
        raise error(
            f"{what} is a function, not its compiled program; pass f.lower(*args).compile(), "
            "compiled for the arguments you mean."
        )
    raise error(
        f"{what} must be a compiled program, f.lower(*args).compile(), not {describe(value)}."
    )
