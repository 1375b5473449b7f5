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

import html
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from book.errors import ReaderError

TAIL_LINES = 20
_POLL_SECONDS = 0.02

# Every worker starts through this shim, which then runs the script as ``__main__``. On Linux it
# first asks the kernel to kill the worker when the process that launched it dies
# (PR_SET_PDEATHSIG), so even a kernel killed outright, where no Python cleanup runs, leaves no
# worker behind. And a worker that raises exits at once: a normal exit would first wait in
# jax.distributed's shutdown barrier for peers that are themselves waiting for it. Native code
# writes to stdout too: Gloo announces every connection it makes there, from several threads at
# once, their words interleaved mid-line. So the shim points file descriptor 1, where native code
# writes, at a log of its own, and gives Python's sys.stdout the worker's output file.
_SHIM = """\
import io, os, runpy, signal, sys, traceback
if sys.platform.startswith("linux"):
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
parent, native, script, *args = sys.argv[1:]
if os.getppid() != int(parent):
    sys.exit("launch: the launching process is gone")
python_out = os.dup(1)
log = os.open(native, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.dup2(log, 1)
os.close(log)
sys.stdout = io.TextIOWrapper(
    open(python_out, "wb", buffering=0),
    encoding="utf-8",
    errors="backslashreplace",
    write_through=True,
)
sys.argv = [script, *args]
sys.path[0] = os.path.dirname(script)
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as stop:
    if stop.code in (None, 0):
        raise
    if not isinstance(stop.code, int):
        print(stop.code, file=sys.stderr)
    code = stop.code if isinstance(stop.code, int) else 1
except BaseException as error:
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    traceback.print_exception(type(error), error, tb or error.__traceback__)
    code = 1
else:
    code = 0
sys.stdout.flush()
sys.stderr.flush()
if code:
    os._exit(code)
"""

EnvChoice = Mapping[str, "str | None"] | Callable[[int], Mapping[str, "str | None"]] | None


class WorkerError(ReaderError, RuntimeError):
    """A worker process failed or outlived the timeout; the message ends with its log's tail.

    ``process`` is the index of the worker named in the message, ``outputs`` what every worker
    had printed to stdout when all were stopped.
    """

    def __init__(self, message: str, process: int, outputs: Outputs):
        super().__init__(message)
        self.process = process
        self.outputs = outputs


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
        columns = []
        for i, text in enumerate(self):
            body = html.escape(text.rstrip()) or "(no output)"
            columns.append(
                '<div style="min-width:0">'
                f'<div style="font-weight:bold;margin-bottom:2px">process {i}</div>'
                '<pre style="margin:0;padding:4px 6px;border:1px solid #bbb;'
                "border-radius:4px;font-size:11px;line-height:1.35;"
                f'white-space:pre-wrap;overflow-wrap:anywhere">{body}</pre></div>'
            )
        grid = (
            f'<div style="display:grid;grid-template-columns:repeat({len(self)},'
            f'minmax(0,1fr));gap:8px">{"".join(columns)}</div>'
        )
        return grid


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no one is listening on right now.

    The operating system picks it, so two launches at the same time (parallel tests, two
    notebooks) do not collide on a fixed port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(
    process_id: int,
    num_processes: int,
    devices_per_process: int,
    coordinator: str,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of one worker: where the coordinator is, who it is, its CPU devices.

    JAX reads every ``jax_*`` option from the upper-case environment variable of the same name,
    so ``JAX_NUM_CPU_DEVICES``, ``JAX_PLATFORMS`` and ``JAX_CPU_COLLECTIVES_IMPLEMENTATION``
    configure the worker before its backend starts; ``jax.distributed.initialize`` reads
    ``JAX_COORDINATOR_ADDRESS`` itself, and the worker passes on the other two. The folder
    this ``book`` package was imported from leads ``PYTHONPATH``, so workers import the same
    package as the notebook, even one taken from a clone rather than installed.
    """
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


def tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``text``, indented, for an error message."""
    kept = text.rstrip().splitlines()[-lines:]
    return "\n".join(f"    {line}" for line in kept) or "    (the log is empty)"


def _check_arguments(script, num_processes, devices_per_process, timeout) -> Path:
    path = Path(script).expanduser().resolve()
    if not path.is_file():
        raise ReaderError(f"There is no worker script at {path}; check the path you passed.")
    for name, value in (
        ("num_processes", num_processes),
        ("devices_per_process", devices_per_process),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ReaderError(f"{name} must be a positive whole number, not {value!r}.")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ReaderError(f"timeout must be a positive number of seconds, not {timeout!r}.")
    return path


def _command(path: Path, args: Sequence, native: Path) -> list[str]:
    """The worker's command line: the shim, then the script; ``native`` logs native stdout."""
    return [sys.executable, "-c", _SHIM, str(os.getpid()), str(native), str(path), *map(str, args)]


def _kill(procs: list[subprocess.Popen]) -> None:
    """Kill every worker's whole process group, then reap the workers.

    Each worker leads its own process group, so this also ends anything a worker started.
    Signals go out before any waiting, so an interrupt during the wait still leaves every
    worker killed.
    """
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs:
        proc.wait()


# Gloo's connection notices are noise beside a worker's output. The shim sends native stdout,
# where Gloo writes them, to a log of its own; a notice that still reaches a log whole goes here.
_GLOO_NOTICE = re.compile(
    r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. "
    r"Expected number of connected peer ranks is : \d+\n?"
)


def _read(path: Path) -> str:
    if not path.exists():
        return ""
    text = path.read_text(encoding="utf-8", errors="replace")
    # Notices printed from several threads at once can nest one inside another; removing the
    # inner one completes the outer, so repeat until none is left.
    while True:
        text, found = _GLOO_NOTICE.subn("", text)
        if not found:
            return text


def _log(folder: Path, i: int) -> str:
    """A worker's log for an error message: its stderr, or its stdout when stderr is empty."""
    return _read(folder / f"{i}.err").strip() or _read(folder / f"{i}.out")


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

    The output of a worker is what its Python code printed to stdout; what native code writes
    to stdout (Gloo's connection notices) is left out.

    Each worker gets ``devices_per_process`` CPU devices, gloo collectives and a coordinator on
    a free local port, and finds ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
    ``JAX_PROCESS_ID`` and ``JAX_NUM_CPU_DEVICES`` in its environment. ``args`` are passed to
    every worker. ``env`` adds variables (a mapping, or a function of the process index giving
    one); a value of ``None`` removes a variable.

    Raises ``WorkerError`` as soon as one worker fails (the others are stopped), or when workers
    are still running after ``timeout`` seconds (all are killed). Whatever happens, including
    ``KeyboardInterrupt``, every worker is gone when this returns or raises.
    """
    path = _check_arguments(script, num_processes, devices_per_process, timeout)
    coordinator = f"127.0.0.1:{free_port()}"
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="book-multihost-") as tmp:
        folder = Path(tmp)
        try:
            for i in range(num_processes):
                penv = worker_env(i, num_processes, devices_per_process, coordinator)
                extra = env(i) if callable(env) else (env or {})
                for key, value in extra.items():
                    if value is None:
                        penv.pop(key, None)
                    else:
                        penv[key] = str(value)
                with open(folder / f"{i}.out", "wb") as out, open(folder / f"{i}.err", "wb") as err:
                    procs.append(
                        subprocess.Popen(
                            _command(path, args, folder / f"{i}.native"),
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=err,
                            env=penv,
                            start_new_session=True,
                        )
                    )
            _wait(procs, folder, path, timeout)
        finally:
            _kill(procs)
        return Outputs([_read(folder / f"{i}.out") for i in range(num_processes)], path.name)


def _wait(procs: list[subprocess.Popen], folder: Path, path: Path, timeout: float) -> None:
    """Return when every worker has exited cleanly; raise at the first failure or the timeout."""
    n = len(procs)
    deadline = time.monotonic() + timeout
    while True:
        codes = [proc.poll() for proc in procs]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            _kill(procs)
            i = failed[0]
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
            )
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            _kill(procs)
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
            )
        time.sleep(_POLL_SECONDS)


def _outputs(folder: Path, n: int, path: Path) -> Outputs:
    return Outputs([_read(folder / f"{i}.out") for i in range(n)], path.name)
