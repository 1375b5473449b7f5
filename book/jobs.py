"""A running job of several JAX processes, under Slurm or as local processes: one handle.

Chapter 19 does to a training job what a cluster does to it: it watches the lines the
processes print, sends SIGTERM to all of them as a scheduler does before it takes the machines
back, kills one with SIGKILL, and waits for the job's end. ``book.multihost.start`` gives such a
handle for local processes; ``submit`` gives the same handle for a batch job on a Slurm cluster
(the local one of ``make cluster``, whose nodes share this machine): SIGTERM to every task is
``scancel --signal=TERM``, and a single task is found by its process on this machine. The
``sbatch`` and ``scancel`` commands are the lesson, so ``submit`` and ``signal`` return the
command they ran, for the page to show.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from book import linesearch, slurm, validate
from book.errors import ReaderError
from book.multihost import Outputs, WorkerError, _check_args, _check_env, tail

_POLL_SECONDS = 0.1
_ASK_SECONDS = 1.0
# A task seen running only other programs for this long was started with another script.
_OTHER_SCRIPT_SECONDS = 10.0
# How srun reports a task that ended badly, in the batch job's output.
# srun's own lines start a line; a task's lines carry --label's "N: " in front.
# srun groups the tasks of a node that ended alike: "tasks 0-1", "tasks 2,3", "tasks 0-2,5".
_TASK_END = re.compile(r"^srun: error: \S+: tasks? ([\d,-]+): (.*)$", re.M)


def _task_numbers(listed: str) -> list[int]:
    """The tasks of srun's list, such as "0-2,5": 0, 1, 2 and 5."""
    numbers = []
    for part in filter(None, listed.split(",")):
        first, _, last = part.partition("-")
        if first.isdigit() and (last.isdigit() or not last):
            numbers.extend(range(int(first), int(last or first) + 1))
    return numbers


_SIGNALS = {"Killed": signal.SIGKILL, "Aborted": signal.SIGABRT, "Terminated": signal.SIGTERM}


class SlurmJob:
    """A batch job that ``submit`` queued: its tasks' lines, signals, and its end.

    It mirrors ``book.multihost.Job``: ``started`` and ``ended`` (task index: seconds after the
    submission when its process was gone) on the clock of ``time.monotonic``.
    """

    def __init__(
        self,
        job_id: int,
        script: str,
        num_tasks: int,
        output: Path,
        timeout: float,
        submitted: float = 0.0,
    ):
        self.id, self.script, self.num_tasks, self.output_file = job_id, script, num_tasks, output
        self.timeout = timeout
        # time.time() when sbatch was run: a file of this job's name written before then is
        # an earlier job's, one that had the same id before the cluster was started again.
        self.submitted = submitted
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.ended: dict[int, float] = {}
        self._pids: dict[int, int] = {}
        self._asked = 0.0  # when scontrol was last asked
        self.closed = self.cancelled = False  # by the end of a with block
        self.facts: dict[str, str] = {}

    def __enter__(self) -> SlurmJob:
        return self

    def __exit__(self, *exc) -> None:
        self.closed, self.cancelled = True, not self.facts
        if self.cancelled:
            slurm.cancel(self.id)

    def _still_running(self, call: str) -> None:
        ended = self.cancelled if call.startswith("wait") and call != "wait_for" else self.closed
        if ended:
            what = "signal" if call == "signal" else "wait for"
            raise ReaderError(
                f"Job {self.id} has ended with its with block (cancelled if it still ran), so "
                f"there is nothing left to {what}; call {call} inside the with block, and read "
                "outputs() after it."
            )

    def _read_bytes(self, path: Path) -> bytes:
        """A file this job wrote, or nothing while it has not (an earlier job's, a second or
        more older than the submission, counts as not written)."""
        try:
            if path.stat().st_mtime < self.submitted - 1:
                return b""
            return path.read_bytes()
        except OSError:
            return b""

    def _read(self, path: Path) -> str:
        return self._read_bytes(path).decode("utf-8", "replace")

    def text(self) -> str:
        return self._read(self.output_file)

    def errors(self, process: int) -> str:
        """What task ``process`` wrote to stderr, where the batch script gave each task a file
        ``<anything>-<job id>-<task>.err`` beside the job's output (``srun --error``)."""
        process = self._index(process)
        found = sorted(self.output_file.parent.glob(f"*-{self.id}-{process}.err"))
        return self._read(found[0]) if found else ""

    def _log(self, process: int) -> str:
        """For a message: the task's errors, or the job's output when it wrote none."""
        return tail(self.errors(process) or self.text())

    def outputs(self) -> Outputs:
        """What each task has printed so far (``srun --label``'s lines, split by task)."""
        return slurm.tasks(self._read_bytes(self.output_file), self.num_tasks, self.script)

    def output(self, process: int) -> str:
        return self.outputs()[self._index(process)]

    def signal(self, sig, process: int | None = None) -> str:
        """SIGTERM (or any signal) to every task with ``scancel``, or one task's process.

        Returns what was done, as a command line or in words.
        """
        self._still_running("signal")
        sig = validate.signal_of(sig)
        if process is None:
            if slurm.job(self.id).get("JobState") in slurm.ENDED:
                return f"nothing sent: job {self.id} had already ended"
            command = ["scancel", f"--signal={sig.name.removeprefix('SIG')}", str(self.id)]
            slurm.run(command)
            return shlex.join(command)
        pid = self._pid(process)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # the task ended (its job cancelled, or it finished)
            return f"nothing sent: task {process}'s process {pid} had already ended"
        return f"kill -{sig.name.removeprefix('SIG')} {pid}  # task {process}'s process"

    def wait_for(self, pattern: str, process: int = 0) -> re.Match:
        """Wait until task ``process`` prints a line matching ``pattern``; return the match."""
        self._still_running("wait_for")
        regex = validate.pattern(pattern)
        process = self._index(process)
        with linesearch.Search(regex, f"task {process}'s output") as search:
            while True:
                found = search(self.output(process), self.deadline)
                if found:
                    return found
                if self._over():
                    found = search(self.output(process), self.deadline, ended=True)  # its last
                    if found:
                        return found
                    self._labelled()
                    raise WorkerError(
                        f"Job {self.id} ended before task {process} printed a line matching "
                        f"{validate.describe(regex.pattern, 60)}; read why at the end of its "
                        f"log:\n{self._log(process)}",
                        process,
                        self.outputs(),
                    )
                self._check_time()
                time.sleep(_POLL_SECONDS)

    def wait(self) -> Outputs:
        """Wait for the job's end; return what each task printed, or raise if it failed."""
        self._still_running("wait")
        codes = self.wait_for_exits()
        if self.facts.get("JobState") != "COMPLETED" or any(codes):
            # The task that failed by itself, not one Slurm then ended (a negative status).
            failed = next((i for i, code in enumerate(codes) if code > 0), None)
            failed = (
                next((i for i, code in enumerate(codes) if code), 0) if failed is None else failed
            )
            raise WorkerError(
                f"Job {self.id} ended {self.facts.get('JobState', '')} (exit statuses "
                f"{codes}); fix the error at the end of task {failed}'s log:\n"
                f"{self._log(failed)}",
                failed,
                self.outputs(),
                exit_code=codes[failed],
            )
        self._labelled()
        return self.outputs()

    def _labelled(self) -> None:
        """Refuse, once the job has ended, an output whose lines are no task's: its tasks ran
        without ``srun --label``, or outside srun, so no line can be given to a task."""
        if self.facts.get("JobState") != "COMPLETED":  # a failed job's log says why
            return
        lines = [line for line in self.text().splitlines() if line.strip()]
        if lines and not any(self.outputs()) and not any(map(_TASK_END.match, lines)):
            raise ReaderError(
                f"Job {self.id}'s output has no task labels, so no line is any task's; run the "
                "batch script's tasks with 'srun --label'."
            )

    def wait_for_exits(self) -> list[int]:
        """Wait until the job is over; each task's exit status, as ``Popen`` gives one.

        A task srun reports killed by a signal gets minus that signal, one that exited with an
        error its exit code, and the others 0.
        """
        self._still_running("wait_for_exits")
        while not self._over():
            self._check_time()
            time.sleep(_POLL_SECONDS)
        ran = str(self.facts.get("NumTasks", ""))
        if ran.isdigit() and int(ran) < self.num_tasks:  # a task that never ran is no 0
            raise ReaderError(
                f"Job {self.id} had {ran} task(s) (Slurm's NumTasks), but num_tasks is "
                f"{self.num_tasks}; pass the number of tasks its srun runs."
            )
        codes = [0] * self.num_tasks
        for listed, how in _TASK_END.findall(self.text()):
            exited = re.search(r"[Ee]xit code (\d+)", how)
            word = how.split()[0] if how.split() else ""
            for task in _task_numbers(listed):
                if task >= self.num_tasks:
                    raise ReaderError(
                        f"srun reports task {task} of job {self.id}, but num_tasks is "
                        f"{self.num_tasks}; pass the number of tasks its srun runs."
                    )
                if exited:
                    codes[task] = int(exited.group(1))
                elif word in _SIGNALS:
                    codes[task] = -_SIGNALS[word]
        return codes

    def _over(self) -> bool:
        self._watch()
        # scontrol is a process of its own: asked once a second while a task may still run,
        # so that polling does not take the CPU from the job; at each poll once all ended.
        running = len(self.ended) < self.num_tasks
        if running and time.monotonic() - self._asked < _ASK_SECONDS:
            return False
        self._asked = time.monotonic()
        facts = slurm.job(self.id)
        if facts.get("JobState") in slurm.ENDED:
            self.facts = facts
            now = time.monotonic() - self.started
            for task in range(self.num_tasks):
                self.ended.setdefault(task, now)
            return True
        return False

    def _watch(self) -> None:
        """Note each task's process, and when it is gone."""
        # /proc is read whole only until every task's process is known.
        found = {} if len(self._pids) == self.num_tasks else _task_pids(self.id, self.script)
        now = time.monotonic() - self.started
        for task, pid in found.items():
            self._pids.setdefault(task, pid)
        for task, pid in self._pids.items():
            if task not in self.ended and not Path(f"/proc/{pid}").exists():
                self.ended[task] = now

    def _index(self, process) -> int:
        process = validate.whole(process, "process", low=0, high=validate.MAX_SIZE, example=0)
        if process >= self.num_tasks:
            raise validate.BadValue(
                f"The job has {self.num_tasks} task{'s' * (self.num_tasks > 1)}, numbered 0 "
                f"to {self.num_tasks - 1}; process {process} is none of them."
            )
        return process

    def _pid(self, process: int) -> int:
        process = self._index(process)
        others_since = None  # when the task was first seen running something else
        while process not in self._pids:
            self._watch()
            self._check_time()  # a job still pending at its timeout is cancelled, not waited on
            others = [p for p in _task_processes(self.id).get(process, []) if p[2]]
            if process not in self._pids and others:
                others_since = others_since or time.monotonic()
                if time.monotonic() - others_since > _OTHER_SCRIPT_SECONDS:
                    runs = others[-1][1].decode(errors="replace")
                    raise ReaderError(
                        f"Task {process} of job {self.id} runs {validate.describe(runs, 80)}, "
                        f"no process of {self.script!r}; pass submit the script the batch "
                        "script's tasks run."
                    )
            if self._over():
                raise WorkerError(
                    f"Job {self.id} ended before task {process} started; read why at the end "
                    f"of its log:\n{self._log(process)}",
                    process,
                    self.outputs(),
                )
            time.sleep(_POLL_SECONDS)
        return self._pids[process]

    def _check_time(self) -> None:
        if time.monotonic() > self.deadline:
            facts = slurm.job(self.id)
            slurm.cancel(self.id)
            if facts.get("JobState") == "PENDING":
                raise WorkerError(
                    f"Job {self.id} was still waiting in the queue after {self.timeout:g} s "
                    f"(Slurm's reason: {facts.get('Reason', 'none given')}), so it was "
                    "cancelled; ask for what the cluster has ('sinfo'), or wait longer.",
                    0,
                    self.outputs(),
                    timed_out=True,
                )
            raise WorkerError(
                f"Job {self.id} still ran after {self.timeout:g} s, so it was cancelled; find "
                f"where it waits at the end of its output:\n{tail(self.text())}",
                0,
                self.outputs(),
                timed_out=True,
            )


def _batch_script(batch_script) -> str:
    if not isinstance(batch_script, (str, os.PathLike)) or not str(batch_script).strip():
        raise ReaderError(
            "batch_script must be the path of a batch script, such as 'job.sbatch', not "
            f"{validate.describe(batch_script)}."
        )
    text = str(batch_script)
    try:
        found = "\0" not in text and Path(text).is_file()
    except OSError:  # a name longer than the file system allows, say
        found = False
    if not found:
        raise ReaderError(
            f"There is no batch script at {validate.describe(text)}; write it first, or check "
            "the path you passed."
        )
    return text


def _task_processes(job_id: int) -> dict[int, list[tuple[int, bytes, bool]]]:
    """The processes of a job's tasks on this machine, by task index: (pid, command line,
    whether a step of srun runs it). srun itself is left out: in the batch step it runs with
    task 0's environment, as the batch script's shell does."""
    found = {}
    want = f"SLURM_JOB_ID={job_id}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if os.path.basename(argv[0]) == b"srun":
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        task = [e for e in env if e.startswith(b"SLURM_PROCID=")]
        if want in env and task:
            index = int(task[0].split(b"=", 1)[1])
            in_step = any(e.startswith(b"SLURM_STEP_ID=") for e in env)
            found.setdefault(index, []).append((int(name), b" ".join(argv).strip(), in_step))
    return found


def _task_pids(job_id: int, script: str) -> dict[int, int]:
    """The processes of a job's tasks running ``script`` on this machine, by task index."""
    return {
        task: pid
        for task, running in _task_processes(job_id).items()
        for pid, command, _ in running
        if script.encode() in command
    }


def submit(batch_script, script, args=(), *, num_tasks=2, timeout=180.0, env=None):
    """``sbatch --parsable`` a batch script in this folder; the job, and the command run.

    ``script`` is the Python file the batch script's tasks run: their processes on this
    machine are found by it. The job's output (its tasks' lines, labelled by ``srun
    --label``) goes to ``<name>-<id>.out`` here; ``env`` adds variables to the job's
    environment, which is otherwise the caller's.
    """
    batch_script = _batch_script(batch_script)
    if not isinstance(script, (str, os.PathLike)) or not str(script).strip():
        raise ReaderError(
            f"script must be the path of the Python file the tasks run, not "
            f"{validate.describe(script)}."
        )
    num_tasks = validate.whole(num_tasks, "num_tasks", high=validate.MAX_DEVICES, example=2)
    timeout = validate.seconds(timeout, "timeout")
    args = _check_args(args)
    if env is not None and not isinstance(env, Mapping):
        raise ReaderError(f"env must be a mapping of variables, not {validate.describe(env)}.")
    extra = _check_env(env, 1)[0]
    for key, value in extra.items():
        if value is None:
            raise ReaderError(f"The variable {key!r} is None; a batch job's can only be set.")
        if "," in value or "," in key:  # sbatch --export takes NAME=value,... only
            raise ReaderError(
                f"The variable {key!r} holds a comma, which sbatch --export cannot pass; "
                "give a text without one."
            )
    exports = ",".join(f"{k}={v}" for k, v in extra.items())
    name = Path(batch_script).stem
    if "\\" in name:  # sbatch would then take the pattern's %j as written
        raise ReaderError(
            f"The batch script's name {name!r} holds a backslash, which sbatch reads in the "
            "output file's name; rename the script."
        )
    pattern = name.replace("%", "%%")  # a % of the name, written as itself
    command = ["sbatch", "--parsable", f"--job-name={name}", f"--output={pattern}-%j.out"]
    as_path = os.path.join(".", batch_script) if batch_script.startswith("-") else batch_script
    command += [f"--export=ALL{',' + exports if exports else ''}", as_path, *args]
    submitted = time.time()
    printed = slurm.run(command).strip()
    first = printed.split(";")[0]  # "12" or, with several clusters, "12;cluster"
    try:
        if not (first.isascii() and first.isdigit() and int(first) > 0):  # not -5, +7, 1_2
            raise ValueError
        job_id = int(first)
    except ValueError:
        raise ReaderError(
            f"sbatch --parsable printed {validate.describe(printed, 60)}, not a job id; check "
            "that 'sbatch' here is Slurm's own, not a wrapper that rewrites its output."
        ) from None
    output = Path(f"{name}-{job_id}.out").resolve()
    job = SlurmJob(job_id, Path(str(script)).name, num_tasks, output, timeout, submitted)
    return job, shlex.join(command)
