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
        from book import display

        return display.verdict_html(self.ok, self.message, self.judged)

    def __repr__(self):
        if not self.judged:
            return "Not checked: " + self.message
        if self.ok:
            return "Correct: " + self.message
        if self.message.startswith("Not answered yet"):  # says "not yet" itself
            return self.message
        return "Not yet: " + self.message


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


@dataclass
class ShardMapCall:
    """One ``jax.shard_map`` made while the reader's function was traced: its specs, its inputs'."""

    mesh: object
    in_specs: object
    out_specs: object
    check_vma: bool
    arg_specs: list | None = None  # (in_spec, the input's own spec, its rank) per input


@contextlib.contextmanager
def recording(module, name, wrap):
    """``module.name`` replaced by ``wrap(real)`` while the reader's function is traced.

    A checker learns this way what the reader asked JAX for (the specs of a ``shard_map``, the
    shapes an ``all_gather`` made), so it can explain a refusal from those values instead of
    from the wording of JAX's message. Functions made before the check are not seen.
    """
    real = getattr(module, name)
    setattr(module, name, functools.wraps(real)(wrap(real)))
    try:
        yield
    finally:
        setattr(module, name, real)


def _recording_shard_maps(calls, check_vma=None):
    """A ``jax.shard_map`` that adds a ``ShardMapCall`` to ``calls`` for each function it maps.

    With ``check_vma`` given, every call uses it, whatever the reader passed.
    """
    import jax
    from jax.sharding import PartitionSpec as P

    def is_spec(x):
        return x is None or isinstance(x, P)

    def wrap(real):
        def shard_map(f=None, /, **kw):
            if f is None:  # shard_map(mesh=..., ...) used as a decorator
                return lambda g: shard_map(g, **kw)
            if check_vma is not None:
                kw["check_vma"] = check_vma
            mapped = real(f, **kw)
            call = ShardMapCall(
                kw.get("mesh"), kw.get("in_specs"), kw.get("out_specs"), kw.get("check_vma", True)
            )
            calls.append(call)

            def traced(*args):
                if isinstance(call.in_specs, (tuple, P)) or call.in_specs is None:
                    specs, tree = jax.tree.flatten(call.in_specs, is_leaf=is_spec)
                    with contextlib.suppress(ValueError, TypeError):
                        call.arg_specs = [
                            (spec, jax.typeof(leaf).sharding.spec, jax.typeof(leaf).ndim)
                            for spec, sub in zip(specs, tree.flatten_up_to(args))
                            for leaf in jax.tree.leaves(sub)
                        ]
                return mapped(*args)

            return traced

        return shard_map

    return wrap


def _padded(spec, ndim):
    """A spec with one entry per dimension, so ``P('data')`` and ``P('data', None)`` agree."""
    from jax.sharding import PartitionSpec as P

    entries = [None if e in ((), None) else e for e in (spec or ())]
    return P(*entries, *[None] * (ndim - len(entries)))


def _refused_shard_map(calls, lowers_without_check) -> Wrong | None:
    """The lesson in a ``shard_map`` refusal, read from the specs the reader gave; else None.

    On Explicit mesh axes JAX requires ``in_specs`` equal to the inputs' own specs; and with
    ``check_vma`` it refuses an ``out_specs`` that leaves a mesh axis out for a value it cannot
    prove is the same over that axis (``lowers_without_check()`` says whether the function
    lowers once that check is off).
    """
    import jax
    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P

    for call in calls:
        types = getattr(call.mesh, "axis_types", ())
        if not types or any(t != AxisType.Explicit for t in types):
            continue  # on Auto axes shard_map moves inputs to its in_specs itself
        for want, have, ndim in call.arg_specs or ():
            if want is not None and _padded(want, ndim) != _padded(have, ndim):
                return Wrong(
                    f"Your shard_map's in_specs say {spec_text(want)} for an input placed as "
                    f"{spec_text(have)}; on Explicit mesh axes the in_specs must be the inputs' "
                    "own specs."
                )
    for call in calls:
        axes = set(getattr(call.mesh, "axis_names", ()))
        outs = jax.tree.leaves(call.out_specs, is_leaf=lambda x: x is None or isinstance(x, P))
        partial = [s for s in outs if s is not None and axes - set(jax.tree.leaves(tuple(s)))]
        if call.check_vma and partial and lowers_without_check():
            return Wrong(
                f"JAX refuses your shard_map: out_specs {spec_text(partial[0])} promises a value "
                "that is the same on every device, but each device computes its own; combine "
                "them with psum or pmean first."
            )
    return None


def compile_and_run(fn, *args, stub=None):
    """The reader's function compiled for ``args``, and its result: ``(out, compiled)``.

    Two refusals of ``shard_map`` are lessons of these chapters, so each gets its own sentence
    instead of JAX's page-long message: ``in_specs`` that differ from how an input is placed
    (on Explicit axes they must agree), and ``check_vma`` refusing an ``out_specs`` of ``P()``
    for a value JAX cannot prove is the same on every device. Both are read from the specs of
    the ``shard_map`` calls made while ``fn`` is traced. A function the reader mapped before
    the check (decorated in its cell) is traced again for this, mapped as the exercise's
    ``stub`` maps it (the keyword arguments of its ``jax.shard_map``).
    """
    import inspect

    import jax

    need(callable(fn), f"Not answered yet: pass a function, not a {type(fn).__name__}.")

    def lower(fn, calls, check_vma=None):
        jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
        with (
            recording(jax, "shard_map", _recording_shard_maps(calls, check_vma)),
            jax.default_matmul_precision("highest"),
        ):
            return jitted.lower(*args).compile()

    calls = []
    try:
        compiled = lower(fn, calls)
    except ValueError:
        if not calls and stub is not None and inspect.unwrap(fn) is not fn:
            body = inspect.unwrap(fn)
            fn = lambda *a: jax.shard_map(body, **stub)(*a)  # noqa: E731
            try:
                lower(fn, calls)
            except ValueError:
                pass
            else:
                calls = []  # mapped as the stub maps it, it lowers: the refusal is elsewhere

        def lowers_without_check():
            try:
                lower(fn, [], check_vma=False)
            except Exception:  # noqa: BLE001 - any failure means the check was not the cause
                return False
            return True

        refused = _refused_shard_map(calls, lowers_without_check)
        if refused is None:
            raise
        raise refused from None
    return compiled(*args), compiled


def fresh_source(folder, num_examples, features, seed):
    """A small data set on disk, unlike the chapter's, whose every read is logged."""
    import book.data

    values = np.random.default_rng(seed).integers(-9, 10, size=(num_examples, features))
    return book.data.write(folder, x=values.astype(np.float32))


def takes(fn, args, sentence: str) -> None:
    """Refuse in ``sentence`` a reader's function that cannot be called with ``args``.

    A wrong signature fails in the call itself, before a line of the reader's code runs, so it
    is said plainly instead of as an error inside the reader's code. A callable whose signature
    Python cannot read is let through, to be called.
    """
    try:
        inspect.signature(fn).bind(*args)
    except TypeError:
        raise Wrong(sentence) from None
    except ValueError:
        pass


def ints(shape, seed):
    """Small integers as float32: every sum is exact, so a parallel result equals NumPy's."""
    return np.random.default_rng(seed).integers(-2, 3, size=shape).astype(np.float32)


def first_sentence(err) -> str:
    text = _text(err, None) or type(err).__name__
    return text.split(". ")[0].rstrip(".")[:160]
