"""Find a Slurm cluster that answers, wait for its jobs, and read what they printed.

Chapter 11 runs its multi-process programs under a real Slurm wherever one answers (``make
cluster`` starts two nodes on one Linux machine) and keeps ``book.multihost.launch`` for where
none can run (Colab, a laptop). The ``srun`` and ``sbatch`` commands are the lesson, so the page
writes them out; this module holds what would distract from them: asking ``sinfo`` whether a
cluster answers, waiting for a batch job by polling ``scontrol`` (``sbatch --wait`` notices the
end of a job seconds late), a job's facts as ``scontrol`` states them, and a step's labelled
output (``srun --label``) split into one text per task, without Gloo's connection notices.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from book import validate
from book.errors import ReaderError
from book.multihost import Outputs, tail

# The states of a job that is over (Slurm's JOB_STATE names); the others mean it may still run.
ENDED = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
}
# Node states (sinfo's %t) with CPUs free for a new job, or soon free: "comp" is a node whose
# jobs are all ending, as it is for a few seconds after each job.
USABLE = {"idle", "mix", "comp"}
_POLL_SECONDS = 0.2
_LABEL = re.compile(rb"^ *(\d{1,9}): ?(.*)$")  # with 10 tasks or more, labels are padded
SRUN_PIECE = 1024  # bytes: srun --label prints a longer line as labelled pieces this long

# Gloo announces each connection on stdout, from one thread per local device at once, and
# writes its notice in pieces ("[Gloo] Rank ", "2", " is connected to ", ...), so under srun
# the pieces of several notices arrive interleaved and cut into lines. They come while the
# worker waits in its first collective, between two lines it prints: a line made only of
# the notice's words and numbers is made of those pieces.
_NOTICE_WORDS = set("[Gloo] Rank is connected to peer ranks. Expected number of ranks :".split())
# The pieces, and their numbers, that a flush of native output can leave before a line a task
# printed, when it came while another thread was halfway through its notice.
_LEADING_PIECES = re.compile(
    r"(?:\[Gloo\] Rank|is connected to|peer ranks\.|Expected number of connected peer ranks is :"
    r"|\d+|\s+)+"
)


class SlurmError(ReaderError, RuntimeError):
    """A Slurm command failed, or a job did not end in time; the message says what to do."""


def usable_nodes(timeout: float = 10) -> list[str]:
    """The nodes ``sinfo`` lists as idle, partly used or ending their jobs; empty where no Slurm
    answers.

    No ``sinfo`` on the PATH, a ``sinfo`` that fails (no configuration, no controller) or one
    that does not answer within ``timeout`` seconds all mean the same to a chapter: no cluster
    here. A node another job fills completely is left out, as a new job would wait for it.
    """
    timeout = validate.seconds(timeout, "timeout")
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return []
    try:  # a wrapper's children end with it at the timeout; odd bytes are read, not raised
        done = _started([sinfo, "--noheader", "--Node", "--format=%N %t"], timeout)
    except (SlurmError, OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    nodes = set()
    for line in done.stdout.splitlines():
        words = line.split()
        if len(words) == 2 and words[1].rstrip("*~#!%$@^-") in USABLE:
            nodes.add(words[0])
    return sorted(nodes)


def _command(command) -> list[str]:
    """A command line as a list of texts (paths and whole numbers written out), checked."""
    command = validate.plain(command)
    if isinstance(command, (str, bytes)) or not isinstance(command, (list, tuple)) or not command:
        raise SlurmError(
            "command must be a list of words, such as ['srun', '--ntasks', '2', 'python', "
            f"'task.py'], not {validate.describe(command)}."
        )
    words = []
    for word in command:
        word = validate.plain(word)
        try:
            word = os.fspath(word) if isinstance(word, os.PathLike) else word
        except Exception:  # noqa: BLE001 - a path object whose own conversion fails
            word = None
        if validate._is_whole(word):
            word = str(int(word))
        if not isinstance(word, str) or "\0" in word or not validate.encodable(word):
            raise SlurmError(
                f"Each word of the command must be a text, a path or a whole number, not "
                f"{validate.describe(word)}."
            )
        words.append(word)
    if sum(len(w) for w in words) > 100_000:
        raise SlurmError("The command is too long for a command line; pass a file path instead.")
    return words


def _started(command: list[str], timeout: float):
    """``subprocess.run`` of a checked command, with a program that cannot start said so.

    At the timeout the command's process group is sent SIGTERM (srun cancels its step on
    it), then SIGKILL 10 s later, and ``subprocess.TimeoutExpired`` is raised: killing the
    command alone, as ``subprocess.run`` does, could leave what it started running.
    """
    program = command[0]
    if len(program) > 60 or not program.isprintable():
        program = validate.describe(program, 60)
    try:
        # stdin closed: sbatch given no script reads one from it, and would wait here.
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise SlurmError(
            f"There is no {program} here; start a cluster with 'make cluster' first."
        ) from None
    except OSError as err:  # not executable, or a name too long
        raise SlurmError(f"{program} cannot be run ({err.strerror}); check the command.") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                out, err = proc.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err) from None
    done = subprocess.CompletedProcess(command, proc.returncode, out, err)
    done.output = out  # the bytes, for tasks() to join srun's pieces as bytes
    done.stdout, done.stderr = _text(out), _text(err)
    return done


def run(command: list[str], timeout: float = 30) -> str:
    """Run a Slurm command (``sbatch``, ``scontrol``, ``scancel``) and return its stdout."""
    command = _command(command)
    timeout = validate.seconds(timeout, "timeout")
    try:
        done = _started(command, timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"{command[0]} did not answer within {timeout:g} s; check that the cluster is up "
            "with 'sinfo'."
        ) from None
    if done.returncode != 0:
        raise SlurmError(
            f"{' '.join(command[:2])} failed with exit code {done.returncode}; read why at the "
            f"end of its output:\n{tail(done.stderr or done.stdout)}"
        )
    return done.stdout


def config() -> dict[str, str]:
    """The configuration as ``scontrol show config`` states it, e.g. ``{"KillWait": "5 sec"}``."""
    text = run(["scontrol", "show", "config"])
    return dict(re.findall(r"^(\w+)\s+= (.*?)\s*$", text, re.M))


def step(command: list[str], num_tasks: int = 2, timeout: float = 120) -> Outputs:
    """Run an ``srun --label`` command to its end and return what each task printed.

    A step that fails, or runs past ``timeout`` seconds (then it is stopped), raises
    ``SlurmError`` with the end of its output.
    """
    command = _command(command)
    num_tasks = validate.whole(num_tasks, "num_tasks", high=validate.MAX_DEVICES, example=2)
    timeout = validate.seconds(timeout, "timeout")
    try:
        done = _started(command, timeout)
    except subprocess.TimeoutExpired as err:
        raise SlurmError(
            f"The step still ran after {timeout:g} s, so it was stopped; find where it waits at "
            f"the end of its output, or pass a larger timeout:\n{tail(_text(err.stdout))}"
        ) from None
    script = next((Path(word).name for word in command if word.endswith(".py")), "")
    if done.returncode != 0:
        raise SlurmError(
            f"The step running {script or command[-1]} failed with exit code "
            f"{done.returncode}; fix the error at the end of its output:\n"
            f"{tail(done.stdout + done.stderr)}"
        )
    return tasks(done.output, num_tasks, script)


def time_from(processes, logs, start: str, count: int, timeout: float = 120) -> dict:
    """Time steps from a moment each one prints until it ends, for steps that may never end.

    ``processes`` maps names to running ``Popen`` objects whose output goes to the files in
    ``logs`` (same names); ``start`` is a regular expression whose group is the ``time.time()``
    a step printed, such as ``r"fails at: ([\\d.]+)"``. Waits until ``count`` steps have ended,
    every step has printed its moment, and each one still running has run on from its moment
    at least as long as every ended one took, then returns ``{name: (seconds, ended)}``: the
    seconds from the moment to the end, or to now for a step still running (``ended`` False).
    The caller stops those. Raises ``SlurmError`` after ``timeout`` seconds.
    """
    processes, logs = validate.plain(processes), validate.plain(logs)
    if not isinstance(processes, dict) or not processes:
        given = "an empty dict" if processes == {} else validate.describe(processes)
        raise SlurmError(
            f"processes must be a dict from names to running subprocess.Popen objects, not {given}."
        )
    for name, proc in processes.items():
        if not callable(getattr(proc, "poll", None)):
            raise SlurmError(
                f"processes[{name!r}] is {validate.describe(proc)}; give the subprocess.Popen "
                "that runs the step."
            )
    if not isinstance(logs, dict):
        raise SlurmError(
            f"logs must be a dict with a log file for each of {validate.describe(list(processes))}"
            f", not {validate.describe(logs)}."
        )
    for name in processes:
        if name not in logs or not _log_path(logs[name]):
            given = validate.describe(logs[name]) if name in logs else "missing"
            raise SlurmError(
                f"The log of {name!r} is {given}; give the path of a regular file (or of one "
                "not yet written) that the step's output goes to."
            )
    count = validate.whole(count, "count", high=len(processes), example=2)
    timeout = validate.seconds(timeout, "timeout")
    pattern = validate.pattern(start, "start", error=SlurmError)
    if pattern.groups < 1:
        raise SlurmError(
            "start must have a group around the moment a step prints, such as "
            "r'fails at: ([\\d.]+)'."
        )
    deadline = time.monotonic() + timeout
    ended: dict = {}
    while True:
        now = time.time()
        for name, proc in processes.items():
            if name not in ended and proc.poll() is not None:
                ended[name] = now
        moments = {}
        for name in processes:
            found = pattern.search(_read(logs[name]))
            if found:
                try:
                    moments[name] = float(found.group(1))
                    if not math.isfinite(moments[name]) or moments[name] > now + 1:
                        raise ValueError  # no time.time() yet to come
                except (TypeError, ValueError):
                    raise SlurmError(
                        f"start's group matched {validate.describe(found.group(1))} in the log "
                        f"of {validate.describe(name)}, which is no time.time(); put the group "
                        "around the number only."
                    ) from None
        silent = [name for name in ended if name not in moments]
        if silent:
            raise SlurmError(
                f"The step {silent[0]} ended before it printed its moment; fix the error at "
                f"the end of its output:\n{tail(_read(logs[silent[0]]))}"
            )
        if len(ended) >= count and len(moments) == len(processes):
            took = {name: (ended.get(name, now) - moments[name], name in ended) for name in moments}
            longest = max(seconds for seconds, done in took.values() if done)
            if all(done or seconds >= longest for seconds, done in took.values()):
                return took
        if time.monotonic() > deadline:
            raise SlurmError(
                f"{len(ended)} of the steps had ended and {len(moments)} had printed their "
                f"moment after {timeout:g} s; see what they wait for with 'squeue'."
            )
        time.sleep(0.02)


def _log_path(path) -> bool:
    """Whether ``path`` names a log this module can read without blocking: a regular file, or
    none yet (a FIFO would wait for a writer)."""
    try:
        text = os.fspath(path)
        return (
            isinstance(text, str)
            and "\0" not in text
            and validate.encodable(text)
            and (not os.path.exists(text) or os.path.isfile(text))
        )
    except (TypeError, OSError, ValueError):
        return False


def _read(path) -> str:
    """A file's text with its line ends as written (a lone "\r", a progress bar's, ends no
    line, as Python's universal newlines would make it), or "" where it cannot be read."""
    try:
        return _text(Path(path).read_bytes())
    except OSError:
        return ""


def _text(data) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data or ""


def job(job_id) -> dict[str, str]:
    """What ``scontrol show job`` says of a job, as a dict of its ``Name=value`` fields."""
    job_id = validate.whole(job_id, "job_id", example=12)
    try:
        text = run(["scontrol", "show", "job", "--oneliner", str(job_id)])
    except SlurmError as err:
        if "Invalid job id" in str(err):  # never was, or so long ago Slurm forgot it
            raise SlurmError(f"Slurm knows no job {job_id}; check the job id.") from None
        raise
    return dict(re.findall(r"(?:^|\s)([A-Za-z:/]+)=(\S*)", text.strip()))


def wait(job_id, timeout: float = 120) -> dict[str, str]:
    """Wait until a job is over and return its facts; cancel it and raise at the timeout."""
    job_id = validate.whole(job_id, "job_id", example=12)
    timeout = validate.seconds(timeout, "timeout")
    deadline = time.monotonic() + timeout
    while True:
        facts = job(job_id)
        if facts.get("JobState") in ENDED:
            return facts
        if time.monotonic() > deadline:
            cancel(job_id)
            raise SlurmError(
                f"Job {job_id} was still {facts.get('JobState', 'queued')} after {timeout:g} s, "
                "so it was cancelled; see why with 'squeue', or wait longer."
            )
        time.sleep(_POLL_SECONDS)


def cancel(job_id) -> None:
    """Cancel a job (``scancel``); one that has already ended is left as it is."""
    job_id = validate.whole(job_id, "job_id", example=12)
    try:
        done = _started(["scancel", str(job_id)], timeout=30)
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"scancel did not answer within 30 s, so job {job_id} may still run; check that "
            "the cluster is up with 'sinfo', then cancel it with 'scancel'."
        ) from None
    said = f"{done.stderr}{done.stdout}"
    ended = re.search(r"already completing or completed|Invalid job id", said, re.I)
    if done.returncode != 0 and not ended:  # refused: the job may still run
        raise SlurmError(
            f"scancel {job_id} failed with exit code {done.returncode}, so the job may still "
            f"run; read why at the end of its output:\n{tail(said)}"
        )


def tasks(text: str | bytes, num_tasks: int, script: str = "") -> Outputs:
    """What each task of a step printed, from ``srun --label`` output: one text per task.

    Lines without a task's label (Slurm's own notices, a batch script's echo) are left out, and
    so are Gloo's connection notices, as ``book.multihost.launch`` leaves them out. srun labels
    each 1,024 bytes of a longer line as a line of its own (a line of exactly 1,024 bytes is
    followed by an empty piece): the pieces are joined again, as bytes, so that a character
    cut in two is whole again; pass the output as bytes for that.
    """
    if isinstance(text, bytes):
        data = text
    else:
        text = validate.text(text, "the output", example="'0: ...'", limit=2**31, empty=True)
        data = text.encode("utf-8", "surrogatepass")
    num_tasks = validate.whole(num_tasks, "num_tasks", high=validate.MAX_DEVICES, example=2)
    pieces: list[list[bytes]] = [[] for _ in range(num_tasks)]
    going_on = [False] * num_tasks  # the task's last piece was cut where srun cuts
    beyond: set[int] = set()  # labels of tasks past num_tasks
    # Lines end at "\n" only: a task may print "\u2028" or "\f" inside a line of its own.
    for line in data.removesuffix(b"\n").split(b"\n") if data else []:
        found = _LABEL.match(line)
        if found and int(found.group(1)) >= num_tasks:
            beyond.add(int(found.group(1)))
        elif found:
            task, piece = int(found.group(1)), found.group(2)
            cut = len(piece) == SRUN_PIECE  # before a "\r" that ends the line is taken off
            piece = piece if cut else piece.removesuffix(b"\r")
            if going_on[task]:
                pieces[task][-1] += piece
            else:
                pieces[task].append(piece)
            going_on[task] = cut
    if beyond:
        raise SlurmError(
            f"The output holds lines labelled for task {min(beyond)}, but num_tasks is "
            f"{num_tasks} (tasks 0 to {num_tasks - 1}); pass the number of tasks the step ran."
        )
    texts = []
    for task in pieces:
        task = [piece.decode("utf-8", "replace") for piece in task]
        if any("[Gloo]" in line for line in task):  # only then can a line be a notice's piece
            noise = _notices(task)
            kept = [_without_leading_pieces(x) for i, x in enumerate(task) if i not in noise]
            old = [x for i, x in enumerate(task) if i not in noise]
            task = [x for x, was in zip(kept, old, strict=True) if x.strip() or not was.strip()]
        texts.append("".join(line + "\n" for line in task))  # blank lines kept, as printed
    return Outputs(texts, script)


def _without_leading_pieces(line: str) -> str:
    """A line without the pieces of Gloo's notices it starts with (numbers alone are kept)."""
    found = _LEADING_PIECES.match(line)
    if found and re.search(r"[A-Za-z]", found.group(0)):
        return line[found.end() :]
    return line


def _notices(lines: list[str]) -> set[int]:
    """The lines that hold nothing but pieces of Gloo's connection notices, by index.

    A piece that starts a notice can follow a number with no space between them ("3[Gloo]
    Rank"). A line of bare numbers is a piece only beside one of words, as a notice prints its
    numbers between its words: a task's own "42" elsewhere is kept.
    """
    words = [line.replace("[Gloo]", " [Gloo] ").split() for line in lines]
    numbers = {i for i, w in enumerate(words) if w and all(x.isdigit() for x in w)}
    worded = {
        i
        for i, w in enumerate(words)
        if w and i not in numbers and all(x in _NOTICE_WORDS or x.isdigit() for x in w)
    }
    noise, run = set(worded), []
    for i in range(len(words) + 1):
        if i in numbers:
            run.append(i)
            continue
        if run and (run[0] - 1 in worded or i in worded):
            noise.update(run)
        run = []
    return noise
