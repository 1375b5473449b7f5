"""What every exercise checker shares: the verdict, and the decorator that makes a checker safe.

A checker stops at the first problem by raising ``Wrong``; the ``checker`` decorator turns that,
or anything the reader's own code raises, into a ``Verdict`` with one sentence. It never raises
and never waits for good: the checker runs under a time limit, under the book's own JAX
settings whatever the reader set globally, and a failure of the checker itself is said to be
that, not blamed on the reader.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import html
import inspect
import os
import sys
import sysconfig
import threading
import traceback
from dataclasses import dataclass

import numpy as np

from book.specs import spec_text as spec_text  # the checkers write specs as readers do

TIME_LIMIT = 60.0  # seconds a checker may run, unless it asks for more with checker(limit=...)
_GRACE = 2.0  # how long a stopped checker gets to unwind


@dataclass(frozen=True)
class Verdict:
    """A checker's answer: whether the exercise is solved, and one sentence why.

    ``judged`` is false when the checker could not judge the answer at all (the checker itself
    failed); such a verdict is neither a pass nor a fail.
    """

    ok: bool
    message: str
    judged: bool = True

    def _repr_html_(self):
        colour, mark = ("#1e7b34", "✔") if self.ok else ("#a33", "✘")
        if not self.judged:
            colour, mark = ("#8a6d00", "?")
        return (
            f"<div style='border-left:4px solid {colour};padding:4px 10px;margin:4px 0'>"
            f"<b style='color:{colour}'>{mark}</b> {html.escape(self.message)}</div>"
        )

    def __repr__(self):
        if not self.judged:
            return "Not checked: " + self.message
        return ("Correct: " if self.ok else "Not yet: ") + self.message


class Wrong(Exception):
    """Raised inside a checker to stop at the first problem with the reader's answer."""


class _Stopped(BaseException):
    """Raised inside a checker's thread when its time is up (not an ``Exception``, so that the
    reader's ``except Exception`` does not swallow it)."""


def checker(func=None, *, limit: float | None = None):
    """Turn a checker that raises ``Wrong`` into one that always returns a ``Verdict``.

    Used bare (``@checker``) or with a time limit of its own (``@checker(limit=120)``); the
    default is ``TIME_LIMIT``. What the limit can and cannot interrupt: the checker runs in a
    thread of its own, and the caller waits for it at most that long, so a verdict always comes
    back in time. When the time is up the thread is asked to stop: Python code (a loop, a
    ``time.sleep`` in short steps) stops at its next line. Native code does not: a program XLA
    is running, such as a ``lax.while_loop`` whose condition never turns false, or one long
    ``time.sleep``, runs on in the background, and the verdict says so: on mock CPU devices
    the kernel goes on working, but the devices that program holds stay busy until the kernel
    is restarted.
    """
    if func is None:
        return functools.partial(checker, limit=limit)
    signature = inspect.signature(func)

    @functools.wraps(func)
    def check(*args, **kwargs):
        try:
            signature.bind(*args, **kwargs)
        except TypeError:
            count = len(signature.parameters)
            names = ", ".join(signature.parameters)
            return Verdict(
                False,
                f"{func.__name__} takes {count} answer{'s' * (count != 1)} ({names}); pass "
                f"{'it' if count == 1 else 'them'} as the exercise's cell does.",
            )
        return _run_limited(func, args, kwargs, TIME_LIMIT if limit is None else limit)

    return check


@contextlib.contextmanager
def book_settings():
    """The JAX settings every chapter runs with, whatever the reader set globally.

    No context mesh (a checker sets its own), jit on, NumPy's rank promotion and JAX's
    standard dtype promotion, no NaN or Inf checks, the default matmul precision and device, and
    transfers allowed. Each is a JAX context manager, so it holds in this thread only and is
    undone on leaving.
    """
    import jax

    with contextlib.ExitStack() as stack:
        for setting in (
            jax.set_mesh(None),
            jax.disable_jit(False),
            jax.numpy_rank_promotion("allow"),
            jax.numpy_dtype_promotion("standard"),
            jax.debug_nans(False),
            jax.debug_infs(False),
            jax.default_matmul_precision(None),
            jax.default_device(None),
            jax.transfer_guard("allow"),
        ):
            stack.enter_context(setting)
        yield


def _run_limited(func, args, kwargs, seconds: float) -> Verdict:
    outcome: dict = {}

    def target():
        try:
            try:
                with book_settings():
                    outcome["message"] = func(*args, **kwargs)
            except Wrong as wrong:
                outcome["wrong"] = wrong
            except _Stopped:
                outcome["stopped"] = True
            except BaseException as err:  # SystemExit and KeyboardInterrupt included
                outcome["error"] = err
        except _Stopped:  # asked to stop just as it finished
            pass

    thread = threading.Thread(target=target, name=f"checker {func.__name__}", daemon=True)
    thread.start()
    try:
        thread.join(seconds)
    except KeyboardInterrupt:  # the reader interrupts: stop the checker too, then let it rise
        _stop(thread)
        raise
    if thread.is_alive():
        return _overtime(thread, seconds)
    if "wrong" in outcome:
        return Verdict(False, _text(outcome["wrong"], None) or "The answer is not right yet.")
    if "error" in outcome:
        return _failure(outcome["error"])
    if "message" in outcome:
        return Verdict(True, str(outcome["message"]))
    return Verdict(False, "The check was stopped before it finished; run it again.", False)


def _stop(thread: threading.Thread) -> None:
    """Ask ``thread`` to stop: ``_Stopped`` is raised in it at its next Python line."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(_Stopped)
    )


def _overtime(thread: threading.Thread, seconds: float) -> Verdict:
    frame = sys._current_frames().get(thread.ident)
    stack = traceback.extract_stack(frame) if frame is not None else []
    mine = [f for f in stack if _is_readers(f.filename)]
    where = _line(mine[-1]) if mine else ""
    for _ in range(int(_GRACE / 0.1)):
        _stop(thread)
        thread.join(0.1)
        if not thread.is_alive():
            break
    if mine:
        head = f"Your code still ran after {seconds:g} s{where}"
        fix = "make it finish, and check again"
    else:
        head = (
            f"The check still ran after {seconds:g} s inside JAX, where a program compiled from "
            "your code may never finish (a lax.while_loop whose condition stays true)"
        )
        fix = "look for such a loop, and check again"
    if not thread.is_alive():
        return Verdict(False, f"{head}, so it was stopped; {fix}.")
    return Verdict(
        False,
        f"{head}, and it cannot be stopped from Python: native code (a compiled program, a long "
        "sleep) runs on in the background, so restart the kernel if the next cells hang.",
    )


_NOT_READERS = tuple(
    os.path.realpath(p) + os.sep
    for p in {
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # the book package
        sysconfig.get_paths().get("stdlib", ""),
        sysconfig.get_paths().get("platstdlib", ""),
        sysconfig.get_paths().get("purelib", ""),
        sysconfig.get_paths().get("platlib", ""),
    }
    if p
)


def _is_readers(filename: str) -> bool:
    """Whether a frame's file is the reader's: not the book's, not Python's, not a package's."""
    if filename.startswith("<frozen") or "site-packages" in filename:
        return False
    path = os.path.realpath(filename) if not filename.startswith("<") else filename
    return not path.startswith(_NOT_READERS)


def _line(frame) -> str:
    code = (frame.line or "").strip()
    code = code if len(code) <= 60 else code[:57] + "..."
    return f" at line {frame.lineno}" + (f" (`{code}`)" if code else "")


def _text(err, limit: int | None = 120) -> str:
    """An exception's message as one line, cut at ``limit`` characters; empty when it has none
    (or cannot say it)."""
    try:
        text = str(err).strip()
    except Exception:
        return ""
    first = text.splitlines()[0].strip() if text else ""
    return first if limit is None or len(first) <= limit else first[: limit - 3] + "..."


def _failure(err: BaseException) -> Verdict:
    """Where an exception came from decides whose it is: the reader's code, or the checker's.

    A line of the reader's on the way is theirs. So is an error JAX raised while it handled the
    reader's function (a wrong signature, a result that is no array): JAX may have removed its
    own frames from the traceback, but it says so in a note, or leaves its frames marked. What
    is raised in the checker's own lines, with nothing of the reader's below, is the checker's.
    """
    frames = traceback.extract_tb(err.__traceback__)
    mine = [f for f in frames if _is_readers(f.filename)]
    said = _text(err)
    what = type(err).__name__ + (f" ({said})" if said else "")
    if mine:
        return Verdict(
            False, f"Your code raised {what}{_line(mine[-1])}; fix that and check again."
        )
    if _through_jax(err, frames):
        return Verdict(False, f"Your code raised {what} inside JAX; fix that and check again.")
    last = frames[-1] if frames else None
    where = f" in {os.path.basename(last.filename)} line {last.lineno}" if last else ""
    return Verdict(
        False,
        f"The checker itself failed with {what}{where}, so it could not judge your answer; "
        "this is not a verdict on your code.",
        judged=False,
    )


def _through_jax(err: BaseException, frames) -> bool:
    """Whether ``err`` was raised inside JAX (its innermost frames, or its filtering's traces)."""
    notes = getattr(err, "__notes__", None) or []
    if any("JAX has removed its internal frames" in str(n) for n in notes):
        return True
    if type(err.__cause__).__name__ == "UnfilteredStackTrace":
        return True
    if type(err).__module__.split(".")[0] in ("jax", "jaxlib"):
        return True
    inner = frames[-1].filename if frames else ""
    return any(f"{os.sep}{top}{os.sep}" in inner for top in ("jax", "jaxlib"))


def need(condition, message):
    if not condition:
        raise Wrong(message)


def answered(answer, what):
    need(answer is not None and answer is not ..., f"Not answered yet: {what}.")


def line_mesh(axis):
    """The chapters' mesh: the 8 devices along one Explicit axis, equal to the reader's own."""
    import jax
    from jax.sharding import AxisType

    return jax.make_mesh((8,), (axis,), axis_types=(AxisType.Explicit,))


def compile_and_run(fn, *args):
    """The reader's function compiled for ``args``, and its result: ``(out, compiled)``.

    Two refusals of ``shard_map`` are lessons of these chapters, so each gets its own sentence
    instead of JAX's page-long message: ``in_specs`` that differ from how an input is placed
    (on Explicit axes they must agree), and ``check_vma`` refusing an ``out_specs`` of ``P()``
    for a value JAX cannot prove is the same on every device.
    """
    import re

    import jax

    need(callable(fn), f"Not answered yet: pass a function, not a {type(fn).__name__}.")
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    try:
        with jax.default_matmul_precision("highest"):
            compiled = jitted.lower(*args).compile()
    except ValueError as err:
        text = str(err)
        mismatch = re.search(
            r"in_specs passed to shard_map: (P\([^)]*\)) does not match the specs of the "
            r"input: (P\([^)]*\))",
            text,
        )
        if mismatch:
            raise Wrong(
                f"Your shard_map's in_specs say {mismatch.group(1)} for an input placed as "
                f"{mismatch.group(2)}; on Explicit mesh axes the in_specs must be the inputs' "
                "own specs."
            ) from None
        if "statically inferred" not in text:
            raise
        where = re.search(r"(out_specs\S*) is (P\([^)]*\))", text)
        what = f"{where.group(1)}, {where.group(2)}," if where else "out_specs"
        raise Wrong(
            f"JAX refuses your shard_map: {what} promises a value that is the same on every "
            "device, but each device computes its own; combine them with psum or pmean first."
        ) from None
    return compiled(*args), compiled


def fresh_source(folder, num_examples, features, seed):
    """A small data set on disk, unlike the chapter's, whose every read is logged."""
    import book.data

    values = np.random.default_rng(seed).integers(-9, 10, size=(num_examples, features))
    return book.data.write(folder, x=values.astype(np.float32))


def ints(shape, seed):
    """Small integers as float32: every sum is exact, so a parallel result equals NumPy's."""
    return np.random.default_rng(seed).integers(-2, 3, size=shape).astype(np.float32)


def first_sentence(err) -> str:
    text = _text(err, None) or type(err).__name__
    return text.split(". ")[0].rstrip(".")[:160]
