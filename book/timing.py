"""Honest timing of JAX computations: warm-up, ``block_until_ready``, medians.

JAX dispatches work asynchronously, so a clock stopped when a call returns measures only the
dispatch; the first call also pays for tracing and compiling. ``measure`` therefore runs the
function a few times untimed, waits for every result, and reports the median of the timed runs,
which one slow run (another process, a page fault) cannot move.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import math
import statistics
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

import numpy as np

from book import validate


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the median and the fastest of ``runs``, each waited on to completion."""

    median: float
    best: float
    runs: tuple[float, ...]

    def __str__(self) -> str:
        return (
            f"{format_seconds(self.median)} (median of {len(self.runs)}, "
            f"best {format_seconds(self.best)})"
        )


@validate.impostors_refused
def format_seconds(seconds: float) -> str:
    """A duration in the unit that keeps it readable: ``"412 µs"``, ``"3.1 ms"``, ``"2.05 s"``.

    Any real number is shown as what it is: a negative one (a difference of two times) in the
    unit of its size, ``nan`` and infinities as ``nan s`` and ``inf s``, so a wrong time is
    seen, not hidden in a unit; anything else is refused.
    """
    value = validate.plain(validate.scalar(seconds))
    if isinstance(value, (Fraction, Decimal)):  # exact real numbers: shown as floats
        try:
            snan = isinstance(value, Decimal) and value.is_snan()
            value = math.nan if snan else float(value)  # a signalling NaN is a NaN too
        except OverflowError:
            value = math.inf if value > 0 else -math.inf
    if isinstance(value, np.floating):  # a long double, say: a real number all the same
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise validate.BadValue(
            f"seconds must be a number of seconds such as 0.25, not {validate.describe(seconds)}."
        )
    try:
        value = float(value)
    except OverflowError:  # an int or a Fraction past float's range
        value = float("inf") if value > 0 else float("-inf")
    if value == 0:
        value = 0.0  # -0.0 too: no time is no time
    if math.isfinite(value):  # the smallest unit in which the rounded value stays below 1,000
        for scale, unit in ((1e6, "µs"), (1e3, "ms")):
            shown = f"{value * scale:.3g}"
            if abs(float(shown)) < 1000:
                return f"{shown} {unit}"
        if 999.5 <= abs(value) < 1e15:  # past 1,000 s: whole seconds, not an exponent
            return f"{value:,.0f} s"
    return f"{value:.3g} s"


def _block(result):
    import jax

    if inspect.iscoroutine(result) or inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never awaited: close it, so Python does not warn
        raise validate.BadValue(
            "f returned a coroutine (it is async def), whose work runs only when awaited; "
            "time a function that does the work and returns its result."
        )
    if isinstance(result, Iterator):
        raise validate.BadValue(
            f"f returned {validate.describe(result)}, an iterator whose work runs only as it "
            "is read; return the results themselves (a list, or arrays)."
        )
    try:
        jax.block_until_ready(result)
        # What JAX took for a leaf without waiting on it (a dataclass, a namespace, a deque)
        # may still hold arrays.
        unwaited = [x for x in jax.tree.leaves(result) if not hasattr(x, "block_until_ready")]
    except (ValueError, TypeError):  # a dict whose keys JAX cannot sort, as {"loss": 1, 0: 2}
        unwaited = [result]
    except (RecursionError, SystemError) as err:  # JAX's SystemError holds the RecursionError
        if not isinstance(err, RecursionError) and not isinstance(err.__cause__, RecursionError):
            raise
        raise validate.BadValue(
            "f returned a list or dict that holds itself, or one nested too deep for JAX to "
            "wait on its arrays; return the arrays."
        ) from None
    for leaf in _arrays_in(unwaited):
        leaf.block_until_ready()
    return result


def _arrays_in(value, depth: int = 0):
    """The arrays in a result, found by walking it here: JAX's pytrees refuse some (a dict with
    mixed keys) and take others whole, as leaves (a dataclass, a namespace, a deque, a set)."""
    if depth > 100:
        raise validate.BadValue(
            "f returned a list or dict nested too deep to wait on its arrays; return the arrays."
        )
    if callable(getattr(value, "block_until_ready", None)):
        yield value
        return
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        items = value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [getattr(value, field.name, None) for field in dataclasses.fields(value)]
    elif isinstance(value, types.SimpleNamespace):
        items = vars(value).values()
    else:
        return
    for item in items:
        yield from _arrays_in(item, depth + 1)


@validate.impostors_refused
def measure(f: Callable, /, *args, warmup: int = 2, runs: int = 10, **kwargs) -> Timing:
    """Time ``f(*args, **kwargs)`` after ``warmup`` untimed calls, waiting for each result.

    The warm-up calls absorb what only a first call pays: tracing and compilation when ``f``
    is a jitted function not yet compiled, and first-run costs such as allocating buffers
    either way, so the timed runs see only execution.
    """
    validate.callable_(f, "f", error=validate.WrongKind)
    warmup = validate.whole(warmup, "warmup", low=0, high=1000, example=2, error=validate.BadValue)
    runs = validate.whole(runs, "runs", high=100_000, example=10, error=validate.BadValue)
    try:
        inspect.signature(f).bind(*args, **kwargs)
    except TypeError as err:
        raise validate.BadValue(
            f"f cannot be called with these arguments ({err}); pass what f takes (warmup= and "
            "runs= are measure's own: wrap f in a lambda to give it arguments of those names)."
        ) from None
    except ValueError:  # a built-in without a signature to check
        pass
    try:  # an argument deleted before any call: no donation of f's own is to blame
        gone = any(
            callable(getattr(a, "is_deleted", None)) and a.is_deleted()
            for a in _arrays_in((args, kwargs))
        )
    except Exception:  # noqa: BLE001 - arguments nested past walking: f itself will say
        gone = False
    if gone:
        raise validate.BadValue(
            "An array among f's arguments was deleted before measure was called (by an "
            "earlier donating call, or .delete()); pass arrays that still exist."
        )
    calls = 0  # calls that returned whole: a first one that did not returned a deleted array
    try:
        for _ in range(warmup):
            _block(f(*args, **kwargs))
            calls += 1
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            _block(f(*args, **kwargs))
            times.append(time.perf_counter() - start)
            calls += 1
    except RuntimeError as err:
        said = str(err)  # JAX's words for a donated argument, or a result made of one
        if "Array has been deleted" not in said and "deleted or donated buffer" not in said:
            raise
        if not calls:
            raise validate.BadValue(  # the first call's own result was gone
                "f returned an array that was deleted (by .delete(), or a donating call "
                "inside f); return arrays that still exist."
            ) from None
        raise validate.BadValue(
            "f consumed an argument on its first call (donate_argnums deletes it), so the next "
            "run had nothing to read; time a function that keeps its arguments, or one that "
            "passes its result back in, as chapter 12's relu_in_place does."
        ) from None
    return Timing(statistics.median(times), min(times), tuple(times))
