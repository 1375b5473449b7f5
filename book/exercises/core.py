"""What every exercise checker shares: the verdict, and the decorator that makes a checker safe.

A checker stops at the first problem by raising ``Wrong``; the ``checker`` decorator turns that,
or anything the reader's own code raises, into a ``Verdict`` with one sentence. It never raises
and never waits for good: the checker runs under a time limit, under the book's own JAX
settings whatever the reader set globally, and a failure of the checker itself is said to be
that, not blamed on the reader. Whatever the reader's code changes on the way (global JAX
settings, the clocks, the working folder, the environment) is put back, and what it starts
(processes, threads) is stopped, however the check ends. Answers are read through the helpers
below (``function``, ``number``, ``whole``, ``numbers``, ``spec``, ``pair``), so a wrong kind
of answer is named in one sentence rather than failing inside the checker.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import decimal
import fractions
import functools
import gc
import inspect
import logging
import math
import os
import random
import shutil
import signal
import sys
import sysconfig
import tempfile
import threading
import time
import timeit
import traceback
import warnings
from dataclasses import dataclass

try:  # Unix: the limit on open files an answer may lower
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None

import numpy as np

from book import validate
from book.errors import ReaderError
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


class Wrong(ReaderError):
    """Raised inside a checker to stop at the first problem with the reader's answer.

    A ``ReaderError``, so the book's one validation layer (``book.validate``) refuses a wrong
    kind of answer with ``error=Wrong`` in the same sentence it uses everywhere else.
    """


class _Stopped(BaseException):
    """Raised inside a checker's thread when its time is up (not an ``Exception``, so that the
    reader's ``except Exception`` does not swallow it).

    Each time one is raised in a thread it is counted, so a thread that keeps running after
    being stopped is known to have caught it rather than to sit in native code.
    """

    raised: dict[int, int] = {}

    def __init__(self, *args):
        super().__init__(*args)
        ident = threading.get_ident()
        _Stopped.raised[ident] = _Stopped.raised.get(ident, 0) + 1


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

    No context mesh (a checker sets its own), jit on, 32-bit types, NumPy's rank promotion and
    JAX's standard dtype promotion, no NaN or Inf checks, the default matmul precision and
    device, and transfers allowed. Each is a JAX context manager, so it holds in this thread
    only and is undone on leaving.
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
        if hasattr(jax, "enable_x64"):  # the checkers' references are float32, as the chapters
            stack.enter_context(jax.enable_x64(False))
        yield


def _run_limited(func, args, kwargs, seconds: float) -> Verdict:
    outcome: dict = {}
    world = _World(args)

    def target():
        _local.folders = world.folders
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
    try:
        thread.start()
        try:
            thread.join(seconds)
        except KeyboardInterrupt:  # the reader interrupts: stop the checker too, then let it rise
            _stop(thread)
            raise
        if thread.is_alive():
            return _overtime(thread, seconds)
        return _verdict(outcome, (*args, *kwargs.values()))
    finally:
        with contextlib.suppress(Exception):  # putting things back must not cost the verdict
            world.restore(thread)


def _verdict(outcome: dict, answers: tuple = ()) -> Verdict:
    if "wrong" in outcome:
        return Verdict(False, _text(outcome["wrong"], None) or "The answer is not right yet.")
    if "error" in outcome:
        return _failure(outcome["error"], answers)
    if "message" in outcome:
        return Verdict(True, str(outcome["message"]))
    return Verdict(False, "The check was stopped before it finished; run it again.", False)


def _stop(thread: threading.Thread) -> None:
    """Ask ``thread`` to stop: ``_Stopped`` is raised in it at its next Python line."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(_Stopped)
    )


def _stop_all(threads, grace: float) -> tuple[list[threading.Thread], set[int]]:
    """Ask ``threads`` to stop for ``grace`` seconds: those still running, and which moved.

    Each is asked again every 0.1 s, since code that catches the stop may be asked again in a
    moment when it does not. A thread in which the stop was raised and that still runs caught
    it (a loop that swallows it); one in which it was never raised sits in one native call (a
    long sleep, a compiled program). Its innermost line is sampled too, where an interpreter
    raises the stop without counting it.
    """
    _quiet_stops()
    before = {t.ident: _Stopped.raised.get(t.ident, 0) for t in threads}
    moved: dict[int, set] = {t.ident: set() for t in threads}
    for _ in range(max(1, int(grace / 0.1))):
        frames = sys._current_frames()
        for t in threads:
            if t.is_alive():
                frame = frames.get(t.ident)
                if frame is not None:
                    moved[t.ident].add((id(frame.f_code), frame.f_lasti))
                _stop(t)
        time.sleep(0.1)
        if not any(t.is_alive() for t in threads):
            break
    running = [t for t in threads if t.is_alive()]
    caught = {i for i in before if _Stopped.raised.get(i, 0) > before[i] or len(moved[i]) > 1}
    return running, caught


def _quiet_stops() -> None:
    """Let a stopped thread of the reader's end without a traceback in the notebook.

    A reader's thread asked to stop ends with ``_Stopped`` unhandled, which Python reports
    through ``threading.excepthook``, and a stop that lands in a garbage-collector callback is
    reported through ``sys.unraisablehook``; each hook is wrapped once to pass over
    ``_Stopped`` only.
    """
    previous = threading.excepthook
    if not getattr(previous, "_passes_over_stops", False):

        def hook(args):
            if args.exc_type is None or not issubclass(args.exc_type, _Stopped):
                previous(args)

        hook._passes_over_stops = True
        threading.excepthook = hook
    unraisable = sys.unraisablehook  # a stop that lands in a garbage-collector callback
    if not getattr(unraisable, "_passes_over_stops", False):

        def quiet(args):
            if not isinstance(args.exc_value, _Stopped):
                unraisable(args)

        quiet._passes_over_stops = True
        sys.unraisablehook = quiet


def _overtime(thread: threading.Thread, seconds: float) -> Verdict:
    frame = sys._current_frames().get(thread.ident)
    stack = traceback.extract_stack(frame) if frame is not None else []
    mine = [f for f in stack if _is_readers(f.filename)]
    where = _line(mine[-1]) if mine else ""
    running, moving = _stop_all([thread], _GRACE)
    if mine:
        head = f"Your code still ran after {seconds:g} s{where}"
        fix = "make it finish, and check again"
    else:
        head = (
            f"The check still ran after {seconds:g} s inside JAX, where a program compiled from "
            "your code may never finish (a lax.while_loop whose condition stays true)"
        )
        fix = "look for such a loop, and check again"
    if not running:
        return Verdict(False, f"{head}, so it was stopped; {fix}.")
    if thread.ident in moving:
        return Verdict(
            False,
            f"{head}, and it keeps running while it is asked to stop: it catches the stop "
            "(an except BaseException or a bare except inside a loop), so it runs on in the "
            "background; catch only the exceptions you expect, and restart the kernel.",
        )
    return Verdict(
        False,
        f"{head}, and it cannot be stopped from Python: native code (a compiled program, a long "
        "sleep) runs on in the background, so restart the kernel if the next cells hang.",
    )


_local = threading.local()  # the folders of the check running in this thread
_CLOCKS = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns")
_HELPERS = ("resource_tracker", "forkserver")  # Python's own long-lived helper processes


def _watched_modules() -> list:
    """The modules whose functions an answer may replace for the rest of the notebook."""
    import jax
    import jax.numpy as jnp
    import numpy.testing

    books = [m for name, m in list(sys.modules.items()) if name.startswith("book.")]
    return [np, numpy.testing, jax, jnp, jax.lax, jax.random, jax.tree_util, math, os, *books]


def _tables(modules) -> dict:
    """The public dicts, lists and sets of the book's modules (book.sizing.PRESETS, say),
    which an answer may empty or fill: each with a copy of its contents. Private ones are the
    modules' own state (caches, the checkers' records), which the check itself changes."""
    return {
        (module, name): (value, value.copy())
        for module in modules
        if getattr(module, "__name__", "").startswith("book.")
        for name, value in list(vars(module).items())
        if type(value) in (dict, list, set) and not name.startswith("_")
    }


def _listener_lists() -> list[list]:
    """jax.monitoring's lists of listeners, which an answer can add to (empty where absent)."""
    from jax._src import monitoring

    names = ("_event_listeners", "_event_duration_secs_listeners", "_scalar_listeners")
    return [
        getattr(monitoring, name)
        for name in names
        if isinstance(getattr(monitoring, name, None), list)
    ]


def _open_files_limit():
    """The limit on open files (soft, hard), which an answer may lower; None where unknown."""
    try:
        return resource.getrlimit(resource.RLIMIT_NOFILE) if resource else None
    except (OSError, ValueError):
        return None


class _World:
    """What a reader's code may change or start during a check, taken before it and restored.

    Global JAX settings (``jax.config.update`` is not undone by the checker's thread-local
    settings), the clocks (a stand-in installed by a checker that is stopped mid-way, or a
    reader's own patch), the names the reader's functions read clocks through, the working
    folder and the environment are put back; the checker's scratch folders are removed; child
    processes started meanwhile are killed, with their own children; Python threads started
    meanwhile that run the reader's code are asked to stop. Python's own process-wide settings
    an answer may change are put back too: the recursion limit, the warnings filters, the
    standard streams and the built-in names (``print`` replaced to silence it), the modules
    imported and the import path, the exception hooks, every thread's trace and profile hooks,
    and the knobs ``_runtime`` reads. A function registered with ``atexit`` stays: Python
    lists them nowhere. While the check runs, ``os._exit`` called from the reader's code
    raises ``SystemExit`` in its thread instead of ending the kernel. Put back after the
    verdict whether the check finished or not, so nothing outlives a check that had to be
    abandoned.

    Processes are found as descendants of this one, so a process that has left the tree by the
    time the check ends (a daemon that forks twice, or a job a shell started in the background
    and then exited) belongs to init and is not found; only a subreaper or a cgroup around the
    check would catch it, and a notebook's kernel is not the place for either.
    """

    def __init__(self, args):
        import jax

        self.config = dict(jax.config.values)
        self.clocks = {name: getattr(time, name) for name in _CLOCKS if hasattr(time, name)}
        self.default_timer = timeit.default_timer
        real = {id(clock) for clock in self.clocks.values()} | {id(time), id(timeit)}
        self.names = []
        for arg in args:
            try:
                names = getattr(arg, "__globals__", None)
            except Exception:  # noqa: BLE001 - an object whose every attribute raises
                names = None
            if isinstance(names, dict):
                held = {k: v for k, v in list(names.items()) if id(v) in real}
                self.names.append((names, held))
        self.cwd = _cwd()
        self.environ = dict(os.environ)
        self.threads = set(threading.enumerate())
        self.children = _descendants()
        self.folders: list[str] = []
        self.recursion_limit = sys.getrecursionlimit()
        self.warnings = list(warnings.filters)
        self.streams = (sys.stdin, sys.stdout, sys.stderr)
        self.builtins = dict(vars(builtins))
        self.modules = dict(sys.modules)
        self.path = list(sys.path)
        self.hooks = (sys.excepthook, threading.excepthook)
        self.tracing = (threading.gettrace(), threading.getprofile())
        self.runtime = _runtime()
        self.attributes = {module: dict(vars(module)) for module in _watched_modules()}
        self.tables = _tables(self.attributes)
        self.random = (np.random.get_state(), random.getstate())  # an answer may seed them
        self.loggers = {
            name: (logger.level, list(logger.handlers), logger.propagate, logger.disabled)
            for name, logger in [
                ("", logging.getLogger()),
                *logging.root.manager.loggerDict.items(),
            ]
            if isinstance(logger, logging.Logger)
        }
        self.listeners = _listener_lists()
        self.saved_listeners = [list(listeners) for listeners in self.listeners]
        self.open_files = _open_files_limit()
        self.exit = os._exit
        os._exit = _exit_in_thread(self.exit)

    def restore(self, checker: threading.Thread) -> None:
        import jax

        os._exit = self.exit
        for module, names in self.attributes.items():  # np.allclose replaced, say
            for name, value in names.items():
                if vars(module).get(name, value) is not value:
                    setattr(module, name, value)
        np.random.set_state(self.random[0])
        random.setstate(self.random[1])
        for table, saved in self.tables.values():  # book.sizing.PRESETS emptied, say
            if table != saved:
                table.clear()
                if isinstance(table, list):
                    table.extend(saved)
                else:
                    table.update(saved)
        for name, (level, handlers, propagate, disabled) in self.loggers.items():
            logger = logging.getLogger(name or None)
            logger.setLevel(level)
            logger.handlers[:] = handlers
            logger.propagate, logger.disabled = propagate, disabled
        for listeners, saved in zip(self.listeners, self.saved_listeners):
            listeners[:] = saved
        if self.open_files is not None and _open_files_limit() != self.open_files:
            with contextlib.suppress(Exception):
                resource.setrlimit(resource.RLIMIT_NOFILE, self.open_files)
        while _RECORDING:  # the latest first, so each name ends with its real function
            module, name, real = _RECORDING.pop()
            setattr(module, name, real)
        sys.stdin, sys.stdout, sys.stderr = self.streams
        names = vars(builtins)  # print or open replaced, or a name added, for every later cell
        for name in set(names) - set(self.builtins):
            names.pop(name, None)
        names.update((k, v) for k, v in self.builtins.items() if names.get(k) is not v)
        for name, module in self.modules.items():  # a module replaced or removed; new ones stay
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
        if sys.path != self.path:
            sys.path[:] = self.path
        sys.excepthook, threading.excepthook = self.hooks
        if (threading.gettrace(), threading.getprofile()) != self.tracing:
            threading.settrace_all_threads(self.tracing[0])
            threading.setprofile_all_threads(self.tracing[1])
        if _runtime() != self.runtime:
            _set_runtime(*self.runtime)
        with contextlib.suppress(Exception):
            sys.setrecursionlimit(self.recursion_limit)
        if warnings.filters != self.warnings:
            warnings.filters[:] = self.warnings
            with contextlib.suppress(Exception):  # tells Python's cache the filters changed
                warnings._filters_mutated()

        for name, value in self.config.items():
            try:
                changed = jax.config.values.get(name) is not value and bool(
                    jax.config.values.get(name) != value
                )
            except Exception:  # noqa: BLE001 - values that do not compare are left alone
                changed = False
            if changed:
                with contextlib.suppress(Exception):
                    jax.config.update(name, value)
        for name, clock in self.clocks.items():
            setattr(time, name, clock)
        timeit.default_timer = self.default_timer
        for names, held in self.names:
            names.update(held)
        if self.cwd is not None and _cwd() != self.cwd:
            with contextlib.suppress(OSError):
                os.chdir(self.cwd)
        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        for pid in sorted(_descendants() - self.children):
            _kill(pid)
        started = [
            t
            for t in threading.enumerate()
            if t not in self.threads and t is not checker and _runs_readers(t)
        ]
        if started:
            _stop_all(started, _GRACE)
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)


def _runtime() -> tuple:
    """The interpreter's process-wide knobs an answer may turn: the garbage collector, the
    longest integer printed, the thread switch interval, the file mode mask, logging's off level.
    """
    import logging

    mask = os.umask(0o022)
    os.umask(mask)
    return (
        gc.isenabled(),
        sys.get_int_max_str_digits(),
        sys.getswitchinterval(),
        mask,
        logging.root.manager.disable,
    )


def _set_runtime(collecting, digits, interval, mask, logging_off) -> None:
    import logging

    if collecting:
        gc.enable()
    else:
        gc.disable()
    sys.set_int_max_str_digits(digits)
    sys.setswitchinterval(interval)
    os.umask(mask)
    logging.disable(logging_off)


def _exit_in_thread(real):
    """``os._exit`` for the time of a check: ``SystemExit`` in any thread but the main one.

    The reader's code runs in the checker's thread (or threads it starts), so ending the whole
    process from there would end the kernel with the check; a process forked meanwhile (whose
    pid differs) still exits for real.
    """
    owner = os.getpid()

    @functools.wraps(real)
    def exit_(status):
        if os.getpid() == owner and threading.current_thread() is not threading.main_thread():
            raise SystemExit(status)
        real(status)

    return exit_


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the folder was removed under us
        return None


def _descendants() -> set[int]:
    """The processes this one started, and theirs, read from ``/proc`` (empty elsewhere)."""
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            parents[int(entry)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _kill(pid: int) -> None:
    """End a process the reader's code left running (not Python's own helpers), and reap it."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().decode(errors="replace")
    except OSError:
        return
    if any(helper in command for helper in _HELPERS):
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + _GRACE  # dying takes a moment; reaped, it leaves no zombie
    with contextlib.suppress(OSError):  # only our own children can be reaped; others are init's
        while not os.waitpid(pid, os.WNOHANG)[0] and time.monotonic() < deadline:
            time.sleep(0.01)


def _runs_readers(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if _is_readers(frame.f_code.co_filename):
            return True
        frame = frame.f_back
    return False


def scratch_folder(prefix: str) -> str:
    """A new temporary folder for a checker, removed when its check ends however it ends."""
    folder = tempfile.mkdtemp(prefix=prefix)
    folders = getattr(_local, "folders", None)
    if folders is not None:
        folders.append(folder)
    return folder


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


def _failure(err: BaseException, answers: tuple = ()) -> Verdict:
    """Where an exception came from decides whose it is: the reader's code, or the checker's.

    A line of the reader's on the way is theirs. So is an error JAX raised while it handled the
    reader's function (a wrong signature, a result that is no array): JAX may have removed its
    own frames from the traceback, but it says so in a note, or leaves its frames marked; and
    one raised inside a library function given as the answer (``np.sum`` passed where the
    exercise wants a function of the reader's own). What is raised in the checker's own lines,
    with nothing of the reader's below, is the checker's.
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
    if _in_answers(err, answers):
        return Verdict(
            False,
            f"Your answer raised {what}; pass a function of your own, as the exercise's cell "
            "defines it.",
        )
    last = frames[-1] if frames else None
    where = f" in {os.path.basename(last.filename)} line {last.lineno}" if last else ""
    return Verdict(
        False,
        f"The checker itself failed with {what}{where}, so it could not judge your answer; "
        "this is not a verdict on your code.",
        judged=False,
    )


def _codes(answer) -> set:
    """The code objects an answer runs when it is called: its own, or its class's or wrapper's."""
    found = set()
    with contextlib.suppress(Exception):  # an answer whose attributes cannot be read
        for fn in (
            answer,
            inspect.unwrap(answer),
            getattr(answer, "func", None),  # functools.partial
            getattr(answer, "__init__", None),
            getattr(answer, "__call__", None),  # noqa: B004 - the method, not callable()
        ):
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            if inspect.iscode(code):
                found.add(code)
    return found


def _in_answers(err: BaseException, answers: tuple) -> bool:
    """Whether ``err`` was raised inside the code of one of the answers (a library function).

    A built-in answer (``int``, or a ``functools.partial`` of one) runs no Python code: what it
    raises surfaces in the checker's line that called it, a line whose names hold the answer.
    """
    codes = set().union(*(_codes(a) for a in answers if callable(a))) if answers else set()
    frames = [frame for frame, _ in traceback.walk_tb(err.__traceback__)]
    if any(frame.f_code in codes for frame in frames):
        return True
    native = [a for a in answers if callable(a) and not _codes(a)]
    held = frames[-1].f_locals.values() if frames and native else ()
    return any(value is answer for value in held for answer in native)


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


# Reading an answer: each helper gives the value the checker works with, or refuses the wrong
# kind of answer in one sentence that names what was given and what to give instead. --------


def function(fn, what: str, args: tuple, params: str, *, classes: bool = False) -> None:
    """Refuse an answer that is not a function callable with ``args``.

    ``params`` writes the parameters as the exercise's cell does, such as ``(m, k, n)``. A
    wrong signature would fail in the checker's own call, before a line of the reader's code
    runs, so it is named here instead.
    """
    answered(fn, f"define {what}{params} and pass it")
    need(callable(fn), f"Not answered yet: pass a function, not {validate.describe(fn)}.")
    own = classes and isinstance(fn, type)  # a type is an answer where it converts
    if not own and (isinstance(fn, type) or inspect.isbuiltin(fn)):  # no line to blame
        made = "the class" if isinstance(fn, type) else "the built-in"
        raise Wrong(f"Pass a function of your own, {what}{params}, not {made} {fn.__name__}.")
    takes(fn, args, f"{what} should take {params}, as the exercise's cell defines it.")


def returned(value, what: str, wanted: str):
    """Refuse what the reader's function returned: ``{what} returned X; return {wanted}.``"""
    answered(value, f"{what} returns nothing yet; return {wanted}")
    raise Wrong(f"{what} returned {validate.describe(value)}; return {wanted}.")


def shown(value: float, decimals: int = 0) -> str:
    """A number for a sentence: with commas, or in e-notation when that would run to pages.

    A fraction stays one (1/3 of a byte is not 0 bytes), so a verdict never says a reader
    answered what they did not.
    """
    value = value + 0.0 if value == 0 else value  # -0.0 is 0
    if abs(value) >= 1e15:
        return f"{value:.3g}"
    if not decimals and value != round(value):
        return f"{value:.6g}"
    return f"{value:,.{decimals}f}"


def number(value, what: str, wanted: str = "a number") -> float:
    """A finite real number: a Python, NumPy or 0-d JAX number, a Fraction or a Decimal (as in
    a list of them), not ``nan`` nor ``10**400``."""
    if type(value) is decimal.Decimal and value.is_finite():
        value = float(value)
    return validate.number(value, what, low=-math.inf, wanted=wanted, error=Wrong)


def coarse(answer, got: float, want: float, what: str, tolerance: float) -> None:
    """Refuse a right answer that a 16- or 8-bit float holds too coarsely, saying so, rather
    than judging its value wrong: one within its type's rounding (at least 1%) of ``want``
    where the answer asks ``tolerance``."""
    kind = getattr(answer, "dtype", None)
    if kind is not None and getattr(kind, "itemsize", 8) <= 2:
        import ml_dtypes  # JAX's own dependency: finfo of bfloat16 and float8 too

        try:
            window = max(1e-2, float(ml_dtypes.finfo(kind).eps))
        except Exception:  # noqa: BLE001 - an integer type: 1%, as before
            window = 1e-2
        need(
            abs(got - want) <= tolerance or abs(got - want) > window * abs(want),
            f"{what} is a {kind}, too coarse for the answer ({got:.4g}); pass it as a Python "
            "float.",
        )


def full_precision(result, what: str) -> None:
    """Refuse a result held in 16 bits or fewer (bfloat16, float16, float8, int8) before its
    values are judged: a right algorithm rounded so coarsely would otherwise be told that
    its indices or its order of operations are wrong."""
    kind = getattr(result, "dtype", None)
    if kind is not None and getattr(kind, "itemsize", 8) <= 2 and np.dtype(kind).kind != "b":
        raise Wrong(
            f"{what} is {kind}, too coarse to compare with float32; compute and return it in "
            "float32."
        )


def _valued(value):
    """A whole number written another way (8.0, 8 / 1, np.float32(8), Decimal(8)) as the int
    it is: an answer is judged by its value. Anything else as given."""
    scalar = validate.scalar(value)
    if isinstance(scalar, (str, bytes, bool, np.bool_, np.timedelta64, np.datetime64)):
        return value  # text, truth values, durations and dates hold no count
    if validate._is_whole(scalar):
        return value
    with contextlib.suppress(TypeError, ValueError, OverflowError, ArithmeticError):
        as_float = float(scalar)
        if as_float.is_integer():
            return int(as_float)
    return value


def number_returned(value, what: str, wanted: str = "a number") -> float:
    """A finite real number a reader's function returned, refused as ``returned`` words it."""
    try:
        return number(value, what, wanted)
    except Wrong:
        returned(value, what, wanted)


def whole(value, what: str, *, low: int = 1, high: int = validate.MAX_SIZE, example=8) -> int:
    """A whole number from ``low`` to ``high`` (a Python, NumPy or 0-d JAX integer, or one
    written as a float or a Decimal)."""
    value = _valued(value)
    return validate.whole(value, what, low=low, high=high, example=example, error=Wrong)


def _exact(x) -> bool:
    """A Fraction or a Decimal: a number NumPy keeps as an object."""
    return type(x) in (fractions.Fraction, decimal.Decimal)


def unmasked(value, what: str, example: str):
    """``value`` unless it is a NumPy masked array with masked entries, which hold no answer
    (``np.asarray`` would read the values under the mask)."""
    if isinstance(value, np.ma.MaskedArray) and np.ma.is_masked(value):
        raise Wrong(f"{what} holds masked entries, which hold no answer; return {example}.")
    return value


def numbers(value, what: str, example: str = "[1, 2, 3]") -> np.ndarray:
    """An array of real numbers (a list, tuple or array of them), as float64.

    Strings, objects, ragged or self-holding lists are refused by NumPy and named here; so are
    ``nan``, infinities and complex numbers, which no answer holds.
    """
    array = None
    unmasked(value, what, example)
    if not isinstance(value, (str, bytes, dict, set)):
        with contextlib.suppress(Exception):  # NumPy's refusal of a ragged or odd list
            array = validate.widened(np.asarray(validate.scalar(value)))
            if array.dtype.kind == "O" and all(map(_exact, array.flat)):  # Fractions
                array = array.astype(np.float64)
    if array is None or array.dtype.kind not in "biuf":
        given = "complex numbers" if array is not None and array.dtype.kind == "c" else None
        given = given or validate.describe(value)
        raise Wrong(f"{what} should be real numbers, such as {example}, not {given}.")
    # before a copy: a broadcast view stands for 10**12 numbers in a few bytes
    need(array.size <= 10**7, f"{what} holds {array.size:,} numbers; give {example}.")
    with np.errstate(over="ignore"):
        array = array.astype(np.float64)
    need(np.isfinite(array).all(), f"{what} holds numbers that are not finite; give {example}.")
    return array


def sizes(value, what: str, example: str = "(16, 8, 4)") -> tuple[int, ...]:
    """A shape: a tuple or list of whole numbers (0-d arrays of integers too), or a 1-D NumPy
    or JAX array of them, as ``np.array(x.shape)`` or ``jnp.array(...)`` give one."""
    if getattr(value, "ndim", None) == 1 and hasattr(value, "dtype"):
        with contextlib.suppress(Exception):  # a traced value has no numbers to read
            value = np.asarray(value).tolist()
    value = validate.plain(value)  # a list subclass read for what it holds
    if isinstance(value, range):
        value = list(value)
    if isinstance(value, (tuple, list)):
        value = [_valued(v) for v in value]
    if not isinstance(value, (tuple, list)):
        raise Wrong(f"{what} should be a tuple such as {example}, not {validate.describe(value)}.")
    return validate.sizes(value, what, low=0, error=Wrong)


def spec(value, what: str):
    """A ``PartitionSpec``, such as ``P('data', None)``."""
    from jax.sharding import PartitionSpec

    answered(value, f"set {what} to a PartitionSpec, such as P('data', None)")
    if not isinstance(value, PartitionSpec):
        raise Wrong(
            f"{what} is {validate.describe(value)}, not a P(...); write it as P('data', None)."
        )
    return value


def pair(value, what: str, names: str) -> tuple:
    """Two things, as a function returns them: a tuple or list of length 2."""
    value = validate.plain(value)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        returned(value, what, f"two things, {names}")
    return tuple(value)


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
    _RECORDING.append((module, name, real))
    setattr(module, name, functools.wraps(real)(wrap(real)))
    try:
        yield
    finally:
        setattr(module, name, real)
        with contextlib.suppress(ValueError):
            _RECORDING.remove((module, name, real))


# What ``recording`` has replaced and not yet put back: a check abandoned while it traces
# never leaves its ``with`` block, so ``_World.restore`` puts these back itself.
_RECORDING: list[tuple] = []


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

    callable_with(fn, args)

    def lower(fn, calls, check_vma=None):
        # jax.jit's own result as it is; anything else with a .lower (a mock) is traced
        jitted = fn if isinstance(fn, jax.stages.Wrapped) else jax.jit(checked_results(fn))
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


def call(fn, what: str, *args):
    """``fn(*args)``, where ``fn`` is the reader's answer, named ``what`` in a refusal.

    An error raised with no line of the reader's on the way, and not inside JAX, came from a
    function that is not the reader's own (``int``, ``type`` or ``np.sum`` given as the
    answer); it is refused as the answer's, not taken for a failure of the checker itself.
    """
    try:
        return fn(*args)
    except Exception as err:
        frames = traceback.extract_tb(err.__traceback__)
        if any(_is_readers(f.filename) for f in frames) or _through_jax(err, frames):
            raise
        said = _text(err)
        raise Wrong(
            f"{what} raised {type(err).__name__}{f' ({said})' if said else ''}; pass a "
            "function of your own, as the exercise's cell defines it."
        ) from None


def callable_with(fn, args) -> None:
    """Refuse a function that is no function, or that cannot take the exercise's ``args``."""
    answered(fn, "define the function and pass it")
    need(callable(fn), f"Not answered yet: pass a function, not {validate.describe(fn)}.")
    count = f"{len(args)} argument{'s' * (len(args) != 1)}"
    sentence = f"{_name(fn, 'Your function')} should take {count}, as the exercise's cell does."
    takes(fn, args, sentence)


MAX_RESULTS = 256  # arrays an exercise's function may return: far more than any asks for


def checked_results(fn):
    """``fn``, whose result is refused as it returns, while JAX traces it, unless it is arrays.

    JAX refuses a result that holds no array (a string, an object, ``...``) with an error of its
    own, which would read as a mistake inside JAX, and takes minutes over a list of 100,000
    numbers (as many outputs to trace and compile), which would read as a program that never
    ends. Looked at as the function returns, the verdict says what it returned.
    """

    @functools.wraps(fn)
    def checked(*args):
        out = fn(*args)
        if out is ...:
            raise Wrong(
                f"Not answered yet: {_name(fn, 'your function')} returns ...; return the "
                "exercise's arrays."
            )
        leaves = _leaves(out)
        name = _name(fn, "Your function")
        if leaves is not None and len(leaves) > MAX_RESULTS:
            raise Wrong(
                f"{name} returned {len(leaves):,} values; return the arrays the exercise asks for."
            )
        if leaves is None or not all(_array_like(leaf) for leaf in leaves):
            raise Wrong(
                f"{name} returned {validate.describe(out)}, which is no array; return the "
                "arrays the exercise asks for."
            )
        return out

    return checked


def _name(fn, otherwise: str) -> str:
    """A function's name as a sentence can use it, ``otherwise`` for a lambda or an object."""
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) and name.isidentifier() else otherwise


def _leaves(value):
    """The leaves of a tree of results, or None for one JAX cannot walk (one that holds itself)."""
    import jax

    try:
        return jax.tree.leaves(value)
    except Exception:  # noqa: BLE001 - RecursionError, or JAX's SystemError around it
        return None


def _array_like(value) -> bool:
    """Whether JAX takes ``value`` as an array: an array, a tracer or a Python number."""
    if isinstance(value, (bool, int, float, complex, np.number, np.bool_)):
        return True
    return hasattr(value, "shape") and hasattr(value, "dtype")


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
    """An exception's first sentence, without its period, to end a sentence of a checker's."""
    text = _text(err, None) or type(err).__name__
    return text.split(". ")[0].rstrip(".")[:160]
