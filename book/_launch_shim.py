"""The first code of every worker ``book.multihost.launch`` starts; it then runs the script.

Run as ``python -m book._launch_shim PARENT FOLDER NATIVE RAISED SCRIPT [ARGS...]``: PARENT is
the launcher's process id, FOLDER the launch's folder, NATIVE the log that native code's
stdout goes to, RAISED the file that names the exception the script raised, if any.

On Linux the worker becomes a "child subreaper": a process it starts, and anything that one
starts, stays below the worker even when its own parent exits or it moves to a session of its
own, so the worker (and the launcher, looking at the worker's descendants) can always find and
end them. The shim ends them itself when the script finishes, however it finishes.

The kernel tells the worker when the launching process dies (PR_SET_PDEATHSIG, here SIGHUP),
even a kernel killed outright where no Python cleanup runs. The signal's number reaches a pipe
(signal.set_wakeup_fd) that a watcher thread reads, so the worker acts on it even while its
main thread waits in native code: it ends its descendants, removes the launch's folder and
exits. The watcher also checks every half second that the launcher is still its parent.

A worker that raises exits at once: a normal exit would first wait in jax.distributed's
shutdown barrier for peers that are themselves waiting for it. Native code writes to stdout
too: Gloo announces every connection it makes there, from several threads at once, their words
interleaved mid-line. So the shim points file descriptor 1, where native code writes, at a log
of its own, and gives Python's sys.stdout the worker's output file.
"""

import io
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import threading
import traceback


def _descendants(root: int) -> list[int]:
    """Every process below ``root``, read from /proc (empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/stat", "rb") as f:
                fields = f.read().decode("ascii", "replace").rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _end_descendants() -> None:
    """Kill what the script started; a few rounds catch processes started meanwhile."""
    for _ in range(5):
        pids = _descendants(os.getpid())
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _watch(wake: int, parent: int, folder: str) -> None:
    """End the worker when the launcher is gone, or when SIGHUP says it died."""

    def launcher_gone():
        _end_descendants()
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(1)

    while True:
        ready, _, _ = select.select([wake], [], [], 0.5)
        if os.getppid() != parent:
            launcher_gone()
        # SIGHUP comes only from PR_SET_PDEATHSIG: the launcher died, even where the kernel
        # sends it before this process is handed to its new parent and getppid() changes.
        if ready and signal.SIGHUP in os.read(wake, 64):
            launcher_gone()


def _tie_to_launcher(parent: int, folder: str) -> None:
    """Start the watcher, and on Linux become a subreaper that hears its parent's death."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    wake, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGHUP, lambda *_: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(wake, parent, folder), daemon=True).start()
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
        libc.prctl(1, signal.SIGHUP)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        sys.exit("launch: the launching process is gone")


def _split_stdout(native: str) -> None:
    """Native code's stdout to its own log; Python's sys.stdout to the worker's output."""
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
    _children_print_with_python(python_out)


def _children_print_with_python(python_out: int) -> None:
    """A program the script starts (subprocess, os.system) writes to the worker's output.

    It would inherit file descriptor 1, native code's log, and its lines would be lost with
    Gloo's notices; so a child whose stdout is not chosen gets Python's instead.
    """
    popen_init = subprocess.Popen.__init__

    def init(self, args, *rest, **kwargs):
        if len(rest) < 4 and kwargs.get("stdout") is None:  # stdout: the fifth positional
            kwargs["stdout"] = python_out
        popen_init(self, args, *rest, **kwargs)

    def system(command):
        code = subprocess.call(command, shell=True)
        return code << 8 if code >= 0 else -code  # a wait status, as os.system returns

    subprocess.Popen.__init__ = init
    os.system = system


def _run(script: str, args: list[str], raised: str) -> int:
    """Run the script as ``__main__``; its exit code, its exception's name written to ``raised``."""
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(script)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code in (None, 0):
            return 0
        if not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
        elif not 0 <= stop.code <= 255:
            print(
                f"launch: exit code {stop.code} reaches the launcher as {stop.code % 256}: "
                "the operating system keeps 8 bits of it",
                file=sys.stderr,
            )
        return stop.code if isinstance(stop.code, int) else 1
    except BaseException as error:
        kind = type(error)
        with open(raised, "w", encoding="utf-8") as f:
            f.write(f"{kind.__module__}.{kind.__qualname__}")
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        if sys.excepthook is not sys.__excepthook__:  # the script's own, as script_args sets
            sys.excepthook(kind, error, tb or error.__traceback__)
        else:
            traceback.print_exception(kind, error, tb or error.__traceback__)
        return 1
    return 0


def main() -> None:
    parent, folder, native, raised, script, *args = sys.argv[1:]
    _tie_to_launcher(int(parent), folder)
    _split_stdout(native)
    code = _run(script, args, raised)
    _end_descendants()
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        os._exit(code)


if __name__ == "__main__":
    main()
