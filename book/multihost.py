"""Start several JAX processes on this machine, the way a cluster starts one per host.

Multi-controller JAX runs one Python process per host, all running the same program. Part IV
runs such programs for real inside the book: ``launch`` starts the processes on CPU devices,
lets them find each other through a coordinator on a free local port, and returns what each
one printed. The plumbing around that is the point of this module: a worker that crashes stops
its siblings at once (they would otherwise wait forever in a collective), a worker that hangs is
killed at the timeout, and no process outlives ``launch``, not even when the notebook kernel is
interrupted in the middle of it.
"""

from __future__ import annotations

import contextlib
import decimal
import fractions
import functools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from book import linesearch, validate
from book.errors import ReaderError

TAIL_LINES = 20
TAIL_LINE_CHARS = 300  # a longer line of a log is cut in an error message
OUTPUT_BYTES = 256 * 1024  # what is kept of each worker's output: its tail
LOG_BYTES = 64 * 2**20  # a worker that writes more is stopped, before it fills the disk
MAX_DEVICES_PER_PROCESS = 64
_POLL_SECONDS = 0.02
_SCAN_SECONDS = 0.25  # how often the workers' descendants are looked up while they run
_OVERTIME_GRACE = 5.0  # seconds past a job's timeout before its watchdog stops it
_FOLDER_PREFIX = "book-multihost-"
_PORT_TRIES = 3  # launches tried, each on a new port, when the coordinator's port was taken
_RANDOM = random.SystemRandom()  # ports stay apart even where a reader seeded random

EnvChoice = Mapping[str, "str | None"] | Callable[[int], Mapping[str, "str | None"]] | None


class WorkerError(ReaderError, RuntimeError):
    """A worker process failed or outlived the timeout; the message ends with its log's tail.

    The fields say what happened, for code that acts on it: ``process`` is the index of the
    worker named in the message; ``exit_code`` its exit status (negative: the signal that ended
    it), or None when it was still running and was stopped; ``raised`` the qualified name of the
    exception that ended its script, such as ``"builtins.NameError"``, or None; ``timed_out``
    whether the launch ran past its timeout; ``outputs`` what every worker had printed to stdout
    when all were stopped.
    """

    def __init__(
        self,
        message: str,
        process: int,
        outputs: Outputs,
        *,
        exit_code: int | None = None,
        raised: str | None = None,
        timed_out: bool = False,
        port_taken: bool = False,
    ):
        super().__init__(message)
        self.process = process
        self.outputs = outputs
        self.exit_code = exit_code
        self.raised = raised
        self.timed_out = timed_out
        self.port_taken = port_taken


class Outputs(list):
    """What each worker's Python code printed to stdout, in process order: a list of strings.

    In a notebook it shows as one column per process, so a page shows every process's output
    side by side; long lines wrap inside their column rather than being cut off.
    """

    def __init__(self, texts: Sequence[str], script: str = ""):
        super().__init__(texts)
        self.script = script

    def __repr__(self) -> str:
        parts = []
        for i, text in enumerate(self):
            parts.append(f"--- process {i} ---\n{text.rstrip()}")
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        from book import display

        return display.outputs_html(self)


def free_port() -> int:
    """A TCP port that no one is listening on right now, on any of this machine's addresses.

    It is drawn at random below the range the operating system hands out to outgoing
    connections (``ip_local_port_range`` on Linux), so neither another launch (parallel tests,
    two notebooks) nor some program's outgoing connection takes it in the seconds before the
    coordinator starts listening; where that range cannot be read, the system picks one. JAX's
    coordinator listens on every address, so the port is checked free on every address too.
    ``launch`` tries another port when it was taken all the same.
    """
    low = _ephemeral_low()
    for _ in range(100) if low else ():
        port = _RANDOM.randrange(max(1024, low - 16384), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int | None:
    """The first port of Linux's range for outgoing connections, or None where unknown."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return low if low > 2048 else None


def worker_env(
    process_id: int,
    num_processes: int,
    devices_per_process: int,
    coordinator: str,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of one worker: where the coordinator is, who it is, its CPU devices.

    JAX reads most ``jax_*`` options from the upper-case environment variable of the same name,
    so ``JAX_NUM_CPU_DEVICES``, ``JAX_PLATFORMS`` and ``JAX_CPU_COLLECTIVES_IMPLEMENTATION``
    configure the worker before its backend starts; ``jax.distributed.initialize`` reads
    ``JAX_COORDINATOR_ADDRESS`` itself, and the worker passes on the other two. The folder
    this ``book`` package was imported from leads ``PYTHONPATH``, so workers import the same
    package as the notebook, even one taken from a clone rather than installed.
    """
    process_id = validate.whole(process_id, "process_id", low=0, high=validate.MAX_SIZE, example=0)
    num_processes = validate.whole(num_processes, "num_processes", example=2)
    if process_id >= num_processes:
        raise ReaderError(
            f"process_id {process_id} is not one of the {num_processes} processes, numbered 0 "
            f"to {num_processes - 1}."
        )
    devices_per_process = validate.whole(
        devices_per_process, "devices_per_process", high=MAX_DEVICES_PER_PROCESS, example=4
    )
    coordinator = validate.text(coordinator, "the coordinator address", example="'127.0.0.1:1234'")
    base = validate.plain_mapping(base)
    if base is not None and not isinstance(base, Mapping):
        raise ReaderError(f"base must be a mapping of variables, not {validate.describe(base)}.")
    for key, value in (base or {}).items():
        texts = (key, value)
        if not all(isinstance(t, str) and "\0" not in t and validate.encodable(t) for t in texts):
            raise ReaderError(
                f"base holds {validate.describe(key)}: {validate.describe(value)}; every "
                "variable's name and value must be text without NUL, as in os.environ."
            )
        if not key or "=" in key:
            raise ReaderError(
                f"base holds {key!r}, which is no variable name; use names such as 'HOME'."
            )
    env = dict(os.environ if base is None else base)
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(
        [package_root, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    )
    env.update(
        JAX_COORDINATOR_ADDRESS=coordinator,
        JAX_NUM_PROCESSES=str(num_processes),
        JAX_PROCESS_ID=str(process_id),
        JAX_NUM_CPU_DEVICES=str(devices_per_process),
        JAX_PLATFORMS="cpu",
        JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
        PYTHONUNBUFFERED="1",
    )
    return env


def script_args(doc: str, *kinds: Callable) -> list:
    """A worker script's command-line arguments, each read by its kind (``str``, ``int``,
    ``json.loads``...), or an exit with the script's usage line from ``doc``: one sentence,
    not a traceback, for a command typed by hand with an argument missing or mistyped. A kind
    that raises ``ReaderError`` has its sentence printed instead of the usage line.

    Run by hand with no launcher around it, the script's ``jax.distributed.initialize()``
    finds no peers and JAX raises "coordinator_address should be defined"; from here on that
    error ends the script with one sentence naming the launchers, not a traceback, and so does
    a ``ReaderError`` the script's own calls raise.
    """
    script = Path(sys.argv[0]).name
    usage = next((line.strip() for line in doc.splitlines() if "python " in line), script)
    given = sys.argv[1:]
    try:
        if len(given) != len(kinds):
            raise ValueError
        values = [kind(text) for kind, text in zip(kinds, given, strict=True)]
    except ReaderError as err:
        sys.exit(f"{script}: {err}")
    except (ValueError, TypeError, RecursionError):  # JSONDecodeError is a ValueError
        count = f"{len(kinds)} arguments" if len(kinds) != 1 else "argument"
        sys.exit(f"{script}: give its {count} as in: {usage}")
    sys.excepthook = functools.partial(_alone, script, sys.excepthook)
    return values


def launched() -> tuple[int, int]:
    """The process count and index ``launch`` gives a worker in its environment, checked.

    A script that takes ``JAX_NUM_PROCESSES`` as the sign of a launch reads them here, so that
    the variables set by hand and wrong (a count that is no number, an index missing or past
    the count, no coordinator's address) end it with one line naming the variable, not with
    ``int``'s or ``initialize``'s traceback.
    """
    script, env = Path(sys.argv[0]).name, os.environ
    count, rank = env.get("JAX_NUM_PROCESSES", ""), env.get("JAX_PROCESS_ID", "")
    if not (count.isascii() and count.isdigit() and int(count) >= 1):
        sys.exit(f"{script}: set JAX_NUM_PROCESSES to a whole number from 1, not {count!r}.")
    if not (rank.isascii() and rank.isdigit() and int(rank) < int(count)):
        sys.exit(f"{script}: set JAX_PROCESS_ID to a whole number below {count}, not {rank!r}.")
    address = env.get("JAX_COORDINATOR_ADDRESS", "")
    host, _, port = address.rpartition(":")  # [::1]:1234 too
    if not (host.strip() and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        sys.exit(
            f"{script}: set JAX_COORDINATOR_ADDRESS to process 0's host:port, such as "
            f"localhost:12345, not {address!r}."
        )
    return int(count), int(rank)


def positive(text: str) -> int:
    """A kind for ``script_args``: a whole number from 1, such as a count of epochs."""
    return validate.whole(text, "a count", text=True, example=8)


def folder(text: str) -> str:
    """A kind for ``script_args``: a folder that exists, such as a checkpoint to restore."""
    path = validate.path(text, "The folder", "a folder's path")
    if not path.is_dir():
        raise ReaderError(f"There is no folder at {text!r}; give the folder's path.")
    if next(path.iterdir(), None) is None:
        raise ReaderError(f"The folder {text!r} is empty; give the one the chapter wrote.")
    return str(path)  # ~ read as the home folder, as the check above read it


def new_folder(text: str) -> str:
    """A kind for ``script_args`` (and a check for a script's flag): a local folder that exists
    or can be made, such as a cache. It is tried: made in a scratch folder beside where it
    would go, then removed, so a name too long, a file in the way, a folder no one may write
    in, an empty text, NUL or a URL such as gs://b (no local folder) is refused at once."""
    url = text.split("/")[0].endswith(":") if isinstance(text, str) else False
    try:
        if url or not isinstance(text, str) or not text.encode():  # also: not UTF-8
            raise ValueError
        # ~ is the home folder, as a shell reads it (but not after --flag=, so here too)
        text = os.path.expanduser(text)
        path = Path(text).absolute()
        near = next(p for p in [path, *path.parents] if os.path.lexists(p))
        with tempfile.TemporaryDirectory(dir=near) as scratch:
            os.makedirs(Path(scratch, path.relative_to(near)), exist_ok=True)
    except (OSError, ValueError, UnicodeError):
        shown = validate.describe(text, 80)
        raise ReaderError(
            f"No folder can be made at {shown}; give a local folder's path."
        ) from None
    return text


def json_object(fields: str) -> Callable:
    """A kind for ``script_args``: a JSON object holding ``fields`` (named as for
    ``collections.namedtuple``, in one text), such as a run's settings."""
    keys = fields.replace(",", " ").split()

    def kind(text: str) -> dict:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            value = None
        if not isinstance(value, dict) or not set(keys) <= set(value):
            raise ReaderError(
                f"Give a JSON object holding {', '.join(keys)}, as the chapter writes it, not "
                f"{validate.describe(text)}."
            )
        return value

    return kind


def _alone(script: str, hook: Callable, kind, error, trace) -> None:
    """``sys.excepthook`` of a worker script: a ``ReaderError`` (the book's one sentence) and
    JAX's error for a process with no peers to join become one line; every other error goes to
    ``hook``, as it would have."""
    if issubclass(kind, ReaderError):
        print(f"{script}: {error}", file=sys.stderr)
    elif kind is ValueError and str(error) == "coordinator_address should be defined.":
        print(
            f"{script}: it found no peers to join; start it with book.multihost.launch, or "
            "with srun in a Slurm allocation.",
            file=sys.stderr,
        )
    else:
        hook(kind, error, trace)


def tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``text``, indented, each cut at ``TAIL_LINE_CHARS``."""
    text = validate.text(text, "the log", example="'...'", limit=2**31, empty=True)
    lines = validate.whole(lines, "lines", high=10_000, example=TAIL_LINES)
    kept = []
    for line in text.rstrip().splitlines()[-lines:]:
        if len(line) > TAIL_LINE_CHARS:
            line = f"{line[:TAIL_LINE_CHARS]} … ({len(line) - TAIL_LINE_CHARS:,} more characters)"
        kept.append(f"    {line}")
    return "\n".join(kept) or "    (the log is empty)"


def _check_script(script) -> Path:
    try:
        text = os.fspath(script) if isinstance(script, os.PathLike) else script
    except Exception:  # noqa: BLE001 - a path object of the reader's whose __fspath__ fails
        text = None
    text = validate.plain(text)
    if not isinstance(text, str) or not text.strip():
        raise ReaderError(
            f"script must be a path to a Python file, not {validate.describe(script)}."
        )
    if "\0" in text:
        raise ReaderError("The script's path holds a NUL character; check the path you passed.")
    try:
        path = Path(text).expanduser().resolve()
        found = path.is_file()
    except (OSError, RuntimeError, UnicodeError) as err:  # too long, or ~user of no user
        why = getattr(err, "strerror", None) or "no such home folder"
        raise ReaderError(
            f"The script's path {validate.describe(text, 120)} cannot be read ({why}); check "
            "the path you passed."
        ) from None
    if not found:
        raise ReaderError(
            f"There is no worker script at {validate.describe(str(path), 120)}; check the path "
            "you passed."
        )
    return path


def _check_args(args) -> list[str]:
    args = validate.plain(args)
    if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)):
        raise ReaderError(
            f"args must be a list or tuple of arguments, such as ['data', 3], not "
            f"{validate.describe(args)}."
        )
    out = []
    for arg in args:
        arg = validate.plain(arg)
        if isinstance(arg, bool) or not isinstance(
            arg, (str, int, float, os.PathLike, np.integer, np.floating)
        ):
            raise ReaderError(
                f"Each argument must be a text, a number or a path, not {validate.describe(arg)}."
            )
        if isinstance(arg, (int, np.integer)):
            if int(arg).bit_length() > 64:
                raise ReaderError("An argument is a number too large for a command line.")
            text = str(int(arg))
        else:
            try:
                text = os.fspath(arg) if isinstance(arg, os.PathLike) else str(arg)
            except Exception:  # noqa: BLE001 - a path object whose own conversion fails
                text = None
            if not isinstance(text, str):
                raise ReaderError(
                    f"Each argument must be a text, a number or a path, not "
                    f"{validate.describe(arg)}."
                )
        if "\0" in text or not validate.encodable(text):
            raise ReaderError(
                "An argument holds a NUL or a character that is not text (a lone surrogate), "
                "which no command line can carry; remove it."
            )
        out.append(text)
    if sum(len(a) for a in out) > 100_000:
        raise ReaderError(
            "The arguments are too long for a command line; pass a file path instead."
        )
    return out


# What launch gives each worker itself, and the argument that sets it.
_LAUNCH_OWN = {
    "JAX_NUM_PROCESSES": "pass num_processes= instead",
    "JAX_PROCESS_ID": "each worker gets its own index",
    "JAX_NUM_CPU_DEVICES": "pass devices_per_process= instead",
}


def _check_env(env, n: int) -> list[dict[str, str | None]]:
    """Each worker's extra variables, read and checked before any worker starts."""
    if env is not None and not callable(env) and not isinstance(env, Mapping):
        raise ReaderError(
            "env must be a mapping of variables, or a function of the process index giving "
            f"one, not {validate.describe(env)}."
        )
    extras = []
    for i in range(n):
        if callable(env):
            try:
                extra = env(i)
            except Exception as err:
                raise ReaderError(
                    f"env({i}) raised {type(err).__name__}; make it return a mapping of "
                    "variables for every process index."
                ) from None
        else:
            extra = {} if env is None else env
        extra = validate.plain_mapping(extra)
        if not isinstance(extra, Mapping):
            raise ReaderError(
                f"env({i}) gave {validate.describe(extra)}; return a mapping of variables."
            )
        checked = {}
        for key, value in extra.items():
            key, value = validate.plain(key), validate.plain(value)
            if isinstance(value, os.PathLike):
                try:
                    value = os.fspath(value)
                except Exception:  # noqa: BLE001 - a path object whose conversion fails
                    value = object()
            if isinstance(value, (np.integer, np.floating)) and not isinstance(value, bool):
                value = value.item()
            if type(value) in (fractions.Fraction, decimal.Decimal):  # exact numbers, as text
                try:
                    value = str(int(value)) if value == int(value) else str(float(value))
                except (ValueError, OverflowError):  # Decimal's nan and infinities
                    raise ReaderError(
                        f"The variable {key!r} is set to {validate.describe(value)}, no finite "
                        "number; give a text or a finite number."
                    ) from None
            if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
                raise ReaderError(
                    f"The variable {key!r} is set to {validate.describe(value)}, a number too "
                    "large for an environment; give a smaller one or a text."
                )
            if (
                not isinstance(key, str)
                or not key
                or "=" in key
                or "\0" in key
                or not validate.encodable(key)
            ):
                raise ReaderError(
                    f"{validate.describe(key)} is not a variable name; use names such as "
                    "'SLURM_PROCID'."
                )
            if key in _LAUNCH_OWN:
                raise ReaderError(
                    f"env cannot set {key}: launch sets it for each worker; {_LAUNCH_OWN[key]}."
                )
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (str, int, float))
            ):
                raise ReaderError(
                    f"The variable {key!r} is set to {validate.describe(value)}; give a text, "
                    "a number, or None to remove it."
                )
            if value is not None and ("\0" in str(value) or not validate.encodable(str(value))):
                raise ReaderError(
                    f"The variable {key!r} holds a NUL or a character that is not text (a lone "
                    "surrogate); remove it."
                )
            checked[key] = None if value is None else str(value)
        if sum(len(k) + len(v or "") for k, v in checked.items()) > 100_000:
            raise ReaderError(
                "The variables are too long for an environment; pass a file path instead."
            )
        extras.append(checked)
    return extras


def _command(path: Path, args: Sequence[str], folder: Path, i: int) -> list[str]:
    """Worker ``i``'s command line: ``book._launch_shim``, then the script and its arguments."""
    shim = [sys.executable, "-m", "book._launch_shim", str(os.getpid()), str(folder)]
    return [*shim, str(folder / f"{i}.native"), str(folder / f"{i}.raised"), str(path), *args]


# The process tree below the workers, read from /proc on Linux. Elsewhere only process groups
# are known, so a grandchild that starts a session of its own can outlive a launch there. On
# Linux the one that can escape is a process started in a session of its own by a worker that
# leaves through os._exit (skipping the shim's cleanup) before launch's next look, a quarter of
# a second later: as the worker is gone, it is no longer below anything launch knows.


def _stat(pid: int) -> tuple[int, int] | None:
    """A process's parent and start time (in clock ticks since boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().decode("ascii", "replace").rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return children
    for name in names:
        if name.isdigit():
            info = _stat(int(name))
            if info is not None:
                children.setdefault(info[0], []).append(int(name))
    return children


def _below(roots) -> dict[int, int]:
    """Every process below ``roots``, with its start time, so a reused pid is never mistaken."""
    children, found, todo = _children(), {}, list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            info = _stat(child)
            if info is not None and child not in found:
                found[child] = info[1]
                todo.append(child)
    return found


def _mentioning(folder: Path) -> list[int]:
    """Processes whose command line names ``folder``: workers, even one whose Popen was cut."""
    needle = str(folder).encode()
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(name))
            except OSError:
                continue
    return found


def _stop(procs: list[subprocess.Popen], seen: dict[int, int], folder: Path) -> None:
    """End every worker and everything below it, then reap the workers.

    Each worker leads its own process group and session; what it started may have left both,
    so its descendants are looked up (those seen while it ran, and those below it now) and
    killed one by one, a pid only while its start time still matches.
    """
    for _ in range(3):
        below = dict(seen)
        below.update(_below([p.pid for p in procs if p.poll() is None]))
        for pid, started in below.items():
            info = _stat(pid)
            if info is not None and info[1] == started:
                _signal(pid, signal.SIGKILL)
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in _mentioning(folder):
            _signal(pid, signal.SIGKILL)
        if not _below([p.pid for p in procs if p.poll() is None]):
            break
    for proc in procs:
        proc.wait()


def _signal(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@contextlib.contextmanager
def _interrupts_deferred():
    """Hold back Ctrl-C (SIGINT) for a moment: while a worker is being started, or cleaned up.

    An interrupt in the middle of ``Popen`` could leave a started worker that ``launch`` does
    not know of, and one in the middle of the cleanup could leave workers or folders behind. The
    interrupt is raised as soon as the moment is over. Python runs signal handlers in the main
    thread only, so elsewhere there is nothing to hold back.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda *_: caught.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _sweep_stale_folders() -> None:
    """Remove the folders of launches whose launching process has died without cleaning up."""
    for path in Path(tempfile.gettempdir()).glob(f"{_FOLDER_PREFIX}*"):
        found = re.match(rf"{_FOLDER_PREFIX}(\d+)-", path.name)
        if found is None or int(found.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(found.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (PermissionError, OverflowError):
            pass


# Gloo's connection notices are noise beside a worker's output. The shim sends native stdout,
# where Gloo writes them, to a log of its own; a notice that still reaches a log whole goes here.
_GLOO_NOTICE = re.compile(
    r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. "
    r"Expected number of connected peer ranks is : \d+\n?"
)


def _read(path: Path, limit: int = OUTPUT_BYTES, note: bool = True) -> str:
    """A worker's file as text: its last ``limit`` bytes, with a note of what was left out
    (not with ``note=False``, for a search of what the worker printed)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if size > limit:
                f.seek(size - limit)
            data = f.read(limit)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    dropped = max(0, size - limit)
    if dropped:
        cut = text.find("\n")
        if 0 <= cut < 2000:  # start at a line
            dropped += len(text[: cut + 1].encode("utf-8", errors="replace"))
            text = text[cut + 1 :]
    # Notices printed from several threads at once can nest one inside another; removing the
    # inner one completes the outer, so repeat until none is left.
    while True:
        text, found = _GLOO_NOTICE.subn("", text)
        if not found:
            break
    if dropped and note:
        text = f"[{dropped:,} earlier bytes of output left out]\n{text}"
    return text


def _log(folder: Path, i: int) -> str:
    """A worker's log for an error message: its stderr, or its stdout when stderr is empty."""
    return _read(folder / f"{i}.err", 64 * 1024).strip() or _read(folder / f"{i}.out", 64 * 1024)


def _port_taken(log: str, address: str) -> bool:
    """Whether a log shows JAX's coordinator failing to listen on ``address``'s port.

    The coordinator runs in process 0, and gRPC reports the failure in one line naming the
    port; the same words anywhere else (a server of the reader's own) are not the launch's.
    """
    port = address.rpartition(":")[2]
    return any(
        "Failed to add port to server" in line
        and f":{port}'" in line
        and "Address already in use" in line
        for line in log.splitlines()
    )


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"failed with exit code {code}"


def launch(
    script,
    num_processes: int = 2,
    devices_per_process: int = 4,
    timeout: float = 60,
    args: Sequence = (),
    *,
    env: EnvChoice = None,
) -> Outputs:
    """Run ``script`` as ``num_processes`` JAX processes with CPU devices; return their output.

    The output of a worker is what its Python code printed to stdout (its last
    ``OUTPUT_BYTES``, with a note of how much came before) and what the programs it starts
    print; what native code writes to stdout (Gloo's connection notices) is left out.

    Each worker gets ``devices_per_process`` CPU devices, gloo collectives and a coordinator on
    a free local port, and finds ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
    ``JAX_PROCESS_ID`` and ``JAX_NUM_CPU_DEVICES`` in its environment. ``args`` are passed to
    every worker. ``env`` adds variables (a mapping, or a function of the process index giving
    one); a value of ``None`` removes a variable.

    Raises ``WorkerError`` as soon as one worker fails (the others are stopped), or when workers
    are still running ``timeout`` seconds after the launch began, starting them included (all
    are killed). When another program took the coordinator's port first, the workers are
    started again on a new port, within the same ``timeout``. Whatever happens, including
    ``KeyboardInterrupt``, every worker and every process a worker started is gone, and the
    launch's temporary folder removed, when this returns or raises.
    """
    deadline = time.monotonic() + validate.seconds(timeout, "timeout")
    for attempt in range(1, _PORT_TRIES + 1):
        left = max(deadline - time.monotonic(), 0.001) if attempt > 1 else timeout
        job = start(script, num_processes, devices_per_process, left, args, env=env)
        with job:
            try:
                return job.wait()
            except WorkerError as err:
                if not err.port_taken or job.chosen_by_reader or attempt == _PORT_TRIES:
                    raise


def start(
    script,
    num_processes: int = 2,
    devices_per_process: int = 4,
    timeout: float = 60,
    args: Sequence = (),
    *,
    env: EnvChoice = None,
) -> Job:
    """Start ``script`` as ``launch`` does, and return the running workers as a ``Job``.

    For what a cluster does to a running job: the caller watches what the workers print
    (``Job.wait_for``), sends them signals (``Job.signal``), then waits for their end. Use it
    as a context manager: leaving the ``with`` block stops every worker still running and
    removes the launch's folder, as ``launch`` does when it returns. ``timeout`` counts from
    the start, for every wait of the job.
    """
    path = _check_script(script)
    num_processes = validate.processes(num_processes, "num_processes")
    devices_per_process = validate.whole(
        devices_per_process,
        "devices_per_process",
        high=MAX_DEVICES_PER_PROCESS,
        example=4,
        too_large="more CPU devices than one process needs",
    )
    timeout = validate.seconds(timeout, "timeout")
    args = _check_args(args)
    extras = _check_env(env, num_processes)
    deadline = time.monotonic() + timeout
    _sweep_stale_folders()
    port = free_port()
    coordinator = f"127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []
    seen: dict[int, int] = {}
    folder = Path(tempfile.mkdtemp(prefix=f"{_FOLDER_PREFIX}{os.getpid()}-"))
    job = Job(path, procs, seen, folder, timeout, deadline)
    try:
        for i in range(num_processes):
            if time.monotonic() > deadline:
                raise WorkerError(
                    f"Only {i} of {num_processes} workers had started after {timeout:g} s, so "
                    "all were stopped; pass a larger timeout or start fewer processes.",
                    i,
                    _outputs(folder, num_processes, path),
                    timed_out=True,
                )
            penv = worker_env(i, num_processes, devices_per_process, coordinator)
            for key, value in extras[i].items():
                if value is None:
                    penv.pop(key, None)
                else:
                    penv[key] = value
            with (
                open(folder / f"{i}.out", "wb") as out,
                open(folder / f"{i}.err", "wb") as err,
                _interrupts_deferred(),
            ):
                procs.append(
                    subprocess.Popen(
                        _command(path, args, folder, i),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        env=penv,
                        start_new_session=True,
                    )
                )
        job.address = extras[0].get("JAX_COORDINATOR_ADDRESS") or coordinator
        job.chosen_by_reader = job.address != coordinator
        return job
    except BaseException:
        job.stop()
        raise


class Job:
    """Worker processes that ``start`` began, while they run: watch them, signal them, wait.

    ``wait`` ends the job as ``launch`` does, all workers stopped at the first failure (as
    ``srun --kill-on-bad-exit`` does on a cluster); ``wait_for_exits`` instead lets each worker
    end by itself, to see what a program does when nothing stops it from outside. ``stop``
    (or leaving the ``with`` block) kills whatever still runs and removes the job's folder.
    """

    def __init__(self, path, procs, seen, folder, timeout, deadline):
        self.path, self.procs, self.seen, self.folder = path, procs, seen, folder
        self.timeout, self.deadline = timeout, deadline
        self.address, self.chosen_by_reader = "", False
        self.started = time.monotonic()
        self.ended: dict[int, float] = {}  # process index: seconds after start when it exited
        self._next_scan = 0.0
        self._kept: Outputs | None = None  # what the workers printed, once the job stopped
        # A job started without a with block is still stopped, a little after its timeout.
        self._lock = threading.Lock()
        self._watchdog = threading.Timer(timeout + _OVERTIME_GRACE, self.stop)
        self._watchdog.daemon = True
        self._watchdog.start()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def num_processes(self) -> int:
        return len(self.procs)

    def output(self, process: int) -> str:
        """What worker ``process`` has printed to stdout so far (all of it, once stopped)."""
        if self._kept is not None:
            return self._kept[self._index(process)]
        return _read(self.folder / f"{self._index(process)}.out")

    def outputs(self) -> Outputs:
        """What every worker has printed so far, in process order (all of it, once stopped)."""
        if self._kept is not None:
            return self._kept
        return _outputs(self.folder, len(self.procs), self.path)

    def exit_codes(self) -> list[int | None]:
        """Each worker's exit status so far (negative: the signal that ended it; None: running)."""
        return [proc.poll() for proc in self.procs]

    def signal(self, sig, process: int | None = None) -> str:
        """Send signal ``sig`` to one worker, or to every worker (``process=None``).

        It goes to the worker's Python process, the one running the script, as a scheduler
        sends it to each task of a job. Returns what was done, as a ``kill`` command line, or
        in words where every worker it was meant for had already exited.
        """
        sig = validate.signal_of(sig)
        self._still_running("signal")
        targets = range(len(self.procs)) if process is None else [self._index(process)]
        sent = []
        for i in targets:
            if self.procs[i].poll() is None:
                _signal(self.procs[i].pid, sig)
                sent.append(str(self.procs[i].pid))
        if not sent:  # said in words, as a SlurmJob says it: no kill line for nothing done
            whom = "every worker" if process is None else f"worker {targets[0]}"
            return f"nothing sent: {whom} had already exited"
        return f"kill -{sig.name.removeprefix('SIG')} {' '.join(sent)}"

    def wait_for(self, pattern: str, process: int = 0) -> re.Match:
        """Wait until worker ``process`` prints a line matching ``pattern``; return the match.

        Raises ``WorkerError`` when a worker fails first or the job's timeout passes.
        """
        i = self._index(process)
        regex = validate.pattern(pattern)
        self._still_running("wait_for")
        printed = self.folder / f"{i}.out"
        with linesearch.Search(regex, f"process {i}'s output") as search:
            while True:
                found = search(_read(printed, note=False), self.deadline)
                if found:
                    return found
                self._check(stop_at_failure=True)
                if all(code is not None for code in self.exit_codes()):
                    last = _read(printed, note=False)
                    found = search(last, self.deadline, ended=True)  # its last line too
                    if found:
                        return found
                    raise WorkerError(
                        f"Every worker running {self.path.name} ended before process {i} "
                        f"printed a line matching {validate.describe(regex.pattern, 60)}; look "
                        "at its output.",
                        i,
                        self.outputs(),
                    )
                time.sleep(_POLL_SECONDS)

    def wait(self) -> Outputs:
        """Wait until every worker has exited cleanly; return what each printed.

        At the first failure every other worker is stopped and ``WorkerError`` raised, as
        ``launch`` does.
        """
        self._still_running("wait")
        _wait(
            self.procs,
            self.folder,
            self.path,
            self.timeout,
            self.deadline,
            self.seen,
            self.address,
            self.chosen_by_reader,
        )
        return self.outputs()

    def wait_for_exits(self) -> list[int]:
        """Wait until every worker has ended by itself, failed or not; return the exit codes.

        Nothing is stopped from here (unless the job's timeout passes: then all are killed and
        ``WorkerError`` is raised). ``ended`` says when each one exited, in seconds after start.
        """
        self._still_running("wait_for_exits")
        while True:
            codes = self._check(stop_at_failure=False)
            if all(code is not None for code in codes):
                return codes
            time.sleep(_POLL_SECONDS)

    def stop(self) -> None:
        """Kill every worker still running and everything below it; remove the job's folder."""
        if threading.current_thread() is not self._watchdog:
            self._watchdog.cancel()
        with _interrupts_deferred(), self._lock:
            if self._kept is not None:
                return
            _stop(self.procs, self.seen, self.folder)
            self._kept = _outputs(self.folder, len(self.procs), self.path)
            shutil.rmtree(self.folder, ignore_errors=True)

    def _still_running(self, call: str) -> None:
        if self._kept is not None:
            raise ReaderError(
                f"The job running {self.path.name} has stopped (its with block ended), so there "
                f"is nothing to {call.replace('_', ' ')}; call {call} inside the with block, "
                "and read outputs() after it."
            )

    def _index(self, process) -> int:
        return validate.whole(
            process, "process", low=0, high=max(len(self.procs) - 1, 0), example=0
        )

    def _check(self, stop_at_failure: bool) -> list[int | None]:
        """Note exits and descendants; raise at a failure (if asked) or at the timeout."""
        codes = self.exit_codes()
        now = time.monotonic()
        for i, code in enumerate(codes):
            if code is not None and i not in self.ended:
                self.ended[i] = now - self.started
        if stop_at_failure and any(code not in (None, 0) for code in codes):
            self.wait()  # raises WorkerError for the first failure, as launch does
        if now > self.deadline and any(code is None for code in codes):
            self.wait()  # raises WorkerError for the timeout
        if now >= self._next_scan:
            self._next_scan = now + _SCAN_SECONDS
            running = [p.pid for p, code in zip(self.procs, codes) if code is None]
            self.seen.update(_below(running))
        return codes


def _wait(
    procs: list[subprocess.Popen],
    folder: Path,
    path: Path,
    timeout: float,
    deadline: float,
    seen: dict[int, int],
    address: str,
    chosen_by_reader: bool,
) -> None:
    """Return when every worker has exited cleanly; raise at the first failure or the timeout.

    While they run, the processes below them are noted in ``seen``, so one that a worker started
    and left behind is still ended with the launch.
    """
    n = len(procs)
    next_scan = 0.0
    while True:
        codes = [proc.poll() for proc in procs]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            i = failed[0]
            clash = [j for j in failed if j == 0 and _port_taken(_log(folder, j), address)]
            if clash:
                fix = (
                    "choose another port in JAX_COORDINATOR_ADDRESS"
                    if chosen_by_reader
                    else "run the launch again, which picks a new free port"
                )
                raise WorkerError(
                    f"The coordinator could not listen on {address}: another program is using "
                    f"that port, so process {clash[0]} of {n} failed and all workers were "
                    f"stopped; {fix}.",
                    clash[0],
                    _outputs(folder, n, path),
                    exit_code=codes[clash[0]],
                    raised=_raised(folder, clash[0]),
                    port_taken=True,
                )
            also = ""
            if len(failed) > 1:
                others = ", ".join(str(j) for j in failed[1:])
                also = f" (process {others} failed at the same moment)"
            raise WorkerError(
                f"Worker process {i} of {n} running {path.name} {_exit_reason(codes[i])}{also}, "
                "so all workers were stopped; fix the error at the end of its log:\n"
                f"{tail(_log(folder, i))}",
                i,
                _outputs(folder, n, path),
                exit_code=codes[i],
                raised=_raised(folder, i),
            )
        if all(code == 0 for code in codes):
            return
        now = time.monotonic()
        if now > deadline:
            running = [i for i, code in enumerate(codes) if code is None]
            names = ", ".join(str(i) for i in running)
            word = "process" if len(running) == 1 else "processes"
            i = running[0]
            raise WorkerError(
                f"Worker {word} {names} of {n} running {path.name} still ran after {timeout:g} s, "
                "so all workers were killed; find where it waits at the end of the log of "
                f"process {i}, or pass a larger timeout:\n{tail(_log(folder, i))}",
                i,
                _outputs(folder, n, path),
                timed_out=True,
            )
        if now >= next_scan:
            next_scan = now + _SCAN_SECONDS
            seen.update(_below([p.pid for p, code in zip(procs, codes) if code is None]))
            for i in range(n):
                written = sum(_size(folder / f"{i}.{kind}") for kind in ("out", "err", "native"))
                if written > LOG_BYTES:
                    raise WorkerError(
                        f"Worker process {i} of {n} running {path.name} wrote more than "
                        f"{LOG_BYTES // 2**20} MiB of output, so all workers were stopped; "
                        "print less, such as a summary every few steps.",
                        i,
                        _outputs(folder, n, path),
                    )
        time.sleep(_POLL_SECONDS)


def _raised(folder: Path, i: int) -> str | None:
    """The qualified name of the exception that ended worker ``i``'s script, if one did."""
    try:
        return (folder / f"{i}.raised").read_text(encoding="utf-8") or None
    except OSError:
        return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _outputs(folder: Path, n: int, path: Path) -> Outputs:
    return Outputs([_read(folder / f"{i}.out") for i in range(n)], path.name)
