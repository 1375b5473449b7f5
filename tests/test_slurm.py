"""book.slurm: whether a cluster answers, a job's facts, waiting for it, a step's output by task.

Stand-ins for sinfo, scontrol and scancel (small scripts first on the PATH) give the answers a
cluster would; chapter 11 and tests/test_cluster_scripts.py run the real ones.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import book.jobs
import book.slurm
from book.errors import ReaderError
from book.slurm import SlurmError


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """Write executables named like Slurm's commands; each logs its arguments to calls.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    log = tmp_path / "calls.log"

    def make(name, body):
        path = bin_dir / name
        path.write_text(
            f"#!{sys.executable}\nimport sys, time\n"
            f"open({str(log)!r}, 'a').write({name!r} + ' ' + ' '.join(sys.argv[1:]) + '\\n')\n"
            + body
        )
        path.chmod(0o755)

    make.log = log
    return make


def test_tasks_splits_labelled_output_and_drops_notices_and_slurm_lines():
    text = (
        "0: process_index: 0\n"
        "1: process_index: 1\n"
        "srun: error: node2: task 1: Exited with exit code 1\n"
        "0: [Gloo] Rank 0 is connected to 7 peer ranks. Expected number of connected peer ranks "
        "is : 7\n"
        "1: sum: 3\n"
    )
    # Pieces of notices written by several threads at once, as srun passed them on.
    text += "1: [Gloo] Rank 1 is connected to 7 peer ranks. [Gloo] Rank 2 is connected to "
    text += "Expected number of connected peer ranks is : [Gloo] Rank 37\n"
    text += "1:  is connected to 7 peer ranks. 7 peer ranks. Expected number of connected\n"
    text += "1: 7\n"
    text += "0: [Gloo] Rank 0 is connected to 3[Gloo] Rank 3 peer ranks.  is connected to "
    text += "Expected number of connected peer ranks is : 33 peer ranks. \n"
    # A flush that ended halfway through a notice, then a line the task printed.
    text += "1: [Gloo] Rank 1 is connected to 1 peer ranks. [Gloo] Rank 1total: 4\n"
    outputs = book.slurm.tasks(text, 2, "w.py")
    assert list(outputs) == ["process_index: 0\n", "process_index: 1\nsum: 3\ntotal: 4\n"]
    assert outputs.script == "w.py"
    assert book.slurm.tasks("", 2) == ["", ""]


def test_lines_of_tasks_past_num_tasks_are_named_not_dropped():
    with pytest.raises(SlurmError, match="labelled for task 2, but num_tasks is 2") as caught:
        book.slurm.tasks("0: a\n1: b\n2: c\n5: lost\n", 2)
    assert "\n" not in str(caught.value)


def test_a_tasks_own_numbers_and_line_separators_are_kept():
    # A bare number is a notice's piece only beside one; "\u2028" and "\f" end no line.
    text = "0: 42\n1: a\u2028b\f\n0: Rank\n1: 7\n"
    assert list(book.slurm.tasks(text, 2)) == ["42\nRank\n", "a\u2028b\f\n7\n"]
    text = "0: [Gloo] Rank 0 is connected to\n0: 3\n0: 42 steps\n0: 5\n"
    assert list(book.slurm.tasks(text, 1)) == ["42 steps\n5\n"]


def srun_labelled(task: int, line: bytes) -> bytes:
    """A line as srun --label prints it: a labelled piece for every 1,024 bytes, and an
    empty one after a line of a whole number of pieces (as seen from Slurm 22 to 24)."""
    pieces = [line[i : i + 1024] for i in range(0, len(line), 1024)] or [b""]
    if len(line) and len(line) % 1024 == 0:
        pieces.append(b"")
    return b"".join(b"%d: %s\n" % (task, piece) for piece in pieces)


@pytest.mark.parametrize("size", [1023, 1024, 1025, 2048, 3000])
def test_a_long_line_srun_prints_in_pieces_is_one_line_again(size):
    line = b"x" * (size - 9) + b" step 7 "
    line = line[:size]
    text = srun_labelled(1, b"before") + srun_labelled(0, line) + srun_labelled(1, b"a")
    text += srun_labelled(0, b"after")
    outputs = book.slurm.tasks(text.decode(), 2)
    assert outputs[0] == line.decode() + "\nafter\n" and outputs[1] == "before\na\n"


def test_a_character_srun_cuts_in_two_is_whole_again():
    line = "a" * 1023 + "\u00e9 step 7"  # the cut falls inside the two bytes of the e
    assert book.slurm.tasks(srun_labelled(0, line.encode()), 1)[0] == line + "\n"


@pytest.mark.parametrize(
    "first",
    [b"w" * 1022 + b"\xe9", b"w" * 1021 + b"\xff", b"z" * 1023 + b"\r"],  # not cut by srun
)
def test_a_line_shorter_than_a_piece_is_not_joined_to_the_next(first):
    text = srun_labelled(0, first) + srun_labelled(0, b"next line")
    assert book.slurm.tasks(text, 1)[0].endswith("\nnext line\n")


def test_a_carriage_return_that_srun_cut_stays_in_its_line():
    line = b"z" * 1023 + b"\rstep 7 ok"  # the "\r" is the piece's last byte
    assert book.slurm.tasks(srun_labelled(0, line), 1)[0] == line.decode() + "\n"


def test_padded_labels_of_ten_tasks_or_more_are_read():
    text = "".join(f"{i:>2}: hi {i}\n" for i in range(12))
    assert list(book.slurm.tasks(text, 12)) == [f"hi {i}\n" for i in range(12)]


def test_a_carriage_return_ends_no_line_of_a_jobs_output(tmp_path):
    out = tmp_path / "train_job-9.out"
    out.write_bytes(b"0: loss 1.0\rstep 8 ok\r\n0: next\n")
    job = book.jobs.SlurmJob(9, "train.py", 1, out, timeout=60, submitted=time.time())
    assert job.output(0) == "loss 1.0\rstep 8 ok\nnext\n"
    with pytest.raises(ReaderError, match="The job has 1 task, numbered 0 to 0; process 2"):
        job.output(2)


def test_no_sinfo_or_a_failing_or_silent_one_means_no_cluster(stand_ins):
    assert book.slurm.usable_nodes() == []  # nothing on the PATH
    stand_ins("sinfo", "sys.exit(1)\n")
    assert book.slurm.usable_nodes() == []
    stand_ins("sinfo", "time.sleep(30)\n")
    start = time.monotonic()
    assert book.slurm.usable_nodes(timeout=0.5) == []
    assert time.monotonic() - start < 10


def test_odd_bytes_from_sinfo_are_read_and_a_slow_ones_children_end(stand_ins, tmp_path):
    stand_ins("sinfo", "sys.stdout.buffer.write(b'n\\xffde1 idle\\nnode2 mix\\n')\n")
    assert "node2" in book.slurm.usable_nodes()  # no UnicodeDecodeError
    child = tmp_path / "child"
    stand_ins(
        "sinfo",
        "import subprocess\n"
        "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        f"with open({str(child)!r}, 'w') as f:\n    f.write(str(kid.pid))\n"
        "time.sleep(30)\n",
    )
    assert book.slurm.usable_nodes(timeout=1) == []
    pid, ended = int(child.read_text()), time.monotonic() + 5
    while time.monotonic() < ended:  # gone, or a zombie nobody reaps
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().split(") ")[1][0] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError("sinfo's child outlived the timeout")


def test_usable_nodes_are_the_idle_partly_used_and_completing_ones(stand_ins):
    listed = "node1 idle\\nnode2 alloc\\nnode3 mix*\\nnode4 down\\nnode5 comp\\nnode6 drain"
    stand_ins("sinfo", f"print('{listed}')\n")
    # A completing node is free within seconds: a chapter started just as a job ends uses it.
    assert book.slurm.usable_nodes() == ["node1", "node3", "node5"]


def test_job_facts_and_waiting_for_the_end(stand_ins):
    stand_ins(
        "scontrol",
        "print('JobId=7 JobName=ch11-worker JobState=COMPLETED Reason=None ExitCode=0:0 '\n"
        "      'NodeList=node[1-2] StdOut=/tmp/ch11-worker-7.out')\n",
    )
    facts = book.slurm.wait(7, timeout=5)
    assert facts["JobState"] == "COMPLETED" and facts["NodeList"] == "node[1-2]"
    assert facts["StdOut"] == "/tmp/ch11-worker-7.out" and facts["ExitCode"] == "0:0"


def test_a_job_that_outlives_the_wait_is_cancelled(stand_ins):
    stand_ins("scontrol", "print('JobId=8 JobState=RUNNING')\n")
    stand_ins("scancel", "")
    with pytest.raises(SlurmError, match="still RUNNING after 0.5 s, so it was cancelled"):
        book.slurm.wait(8, timeout=0.5)
    assert "scancel 8" in stand_ins.log.read_text()


def test_a_failed_slurm_command_or_step_says_why(stand_ins):
    stand_ins(
        "sbatch",
        "print('sbatch: error: Batch job submission failed', file=sys.stderr)\nsys.exit(1)\n",
    )
    with pytest.raises(SlurmError, match="submission failed"):
        book.slurm.run(["sbatch", "job.sbatch"])
    with pytest.raises(SlurmError, match="There is no scontrol here"):
        book.slurm.run(["scontrol", "show", "config"])
    stand_ins("srun", "print('0: Traceback'); print('0: KeyError: boom'); sys.exit(1)\n")
    with pytest.raises(SlurmError, match=r"running w\.py failed with exit code 1(.|\n)*boom"):
        book.slurm.step(["srun", "--label", sys.executable, "w.py"])
    with pytest.raises(ReaderError):
        book.slurm.job("seven")


def test_time_from_waits_for_the_first_ends_and_runs_the_rest_as_long(tmp_path):
    """Two steps end 0 s and 1 s after their moment; the third, which never ends, is timed for
    at least as long as the slower of them took."""
    logs = {name: tmp_path / f"{name}.out" for name in ("fast", "slower", "never")}
    code = "import sys, time; print(f'at: {{time.time()}}', flush=True); time.sleep({})"
    runs = {}
    try:
        for name, seconds in [("fast", 0), ("slower", 1), ("never", 60)]:
            with logs[name].open("w") as log:
                command = [sys.executable, "-c", code.format(seconds)]
                runs[name] = subprocess.Popen(command, stdout=log)
        took = book.slurm.time_from(runs, logs, r"at: ([\d.]+)", count=2, timeout=30)
    finally:
        for run in runs.values():
            run.kill()
            run.wait()
    assert took["fast"][1] and took["slower"][1] and not took["never"][1]
    assert took["fast"][0] < took["slower"][0] <= took["never"][0] < 30
    assert took["slower"][0] >= 1


def test_time_from_names_a_step_that_ended_without_its_moment(tmp_path):
    log = tmp_path / "silent.out"
    with log.open("w") as out:
        run = subprocess.Popen([sys.executable, "-c", "print('Traceback: boom')"], stdout=out)
    run.wait()
    with pytest.raises(SlurmError, match="silent ended before it printed(.|\n)*boom"):
        book.slurm.time_from({"silent": run}, {"silent": log}, r"at: ([\d.]+)", count=1)


def test_a_watched_job_asks_scontrol_once_a_second_while_its_tasks_run(monkeypatch, tmp_path):
    # Each question is a process; asked at every poll they took the CPU from the job's tasks.
    asked = []
    monkeypatch.setattr(book.jobs, "_task_pids", lambda job_id, script: {0: os.getpid()})
    monkeypatch.setattr(book.slurm, "job", lambda job_id: asked.append(job_id) or {})
    job = book.jobs.SlurmJob(7, "train.py", 1, tmp_path / "out", timeout=60)
    assert not any(job._over() for _ in range(20)) and len(asked) == 1
    job.ended[0] = 1.0  # once every task is gone, the job's end is asked for at each poll
    assert not any(job._over() for _ in range(3)) and len(asked) == 4


def test_a_job_reads_no_file_an_earlier_job_of_its_id_left(tmp_path):
    # Job ids start again with the cluster: a job's output name may already hold an earlier
    # job's lines, which it must not take for its own (a wait for "step 10" would match them).
    out, err = tmp_path / "train_job-9.out", tmp_path / "train_job-9-0.err"
    for path, line in ((out, "0: step 10 | loss 1.0\n"), (err, "an old error\n")):
        path.write_text(line)
        os.utime(path, (time.time() - 3600,) * 2)
    job = book.jobs.SlurmJob(9, "train.py", 2, out, timeout=60, submitted=time.time())
    assert job.text() == "" and job.errors(0) == "" and job.outputs() == ["", ""]
    out.write_text("0: process 0 of 2: from step 5\n")  # the job's own, written now
    assert job.output(0) == "process 0 of 2: from step 5\n"


@pytest.mark.parametrize("printed", ["nan", "inf", "-inf"])
def test_time_from_refuses_a_moment_that_is_no_time(tmp_path, printed):
    log = tmp_path / "a.out"
    log.write_text(f"fails at: {printed}\n")
    run = subprocess.Popen([sys.executable, "-c", "pass"])
    run.wait()
    with pytest.raises(SlurmError, match="which is no time.time"):
        book.slurm.time_from({"a": run}, {"a": log}, r"fails at: (\S+)", 1, timeout=5)
    with pytest.raises(SlurmError, match="The log of 'a' is 5; give the path"):
        book.slurm.time_from({"a": run}, {"a": 5}, r"fails at: (\S+)", 1, timeout=5)
    with pytest.raises(SlurmError, match="logs must be a dict"):
        book.slurm.time_from({"a": run}, [log], r"fails at: (\S+)", 1, timeout=5)


def test_a_tasks_blank_lines_are_kept_as_printed():
    assert book.slurm.tasks(b"0: a\n0: \n0:    \n0: b\n", 1)[0] == "a\n\n   \nb\n"


def test_a_job_slurm_does_not_know_is_named_in_one_sentence():
    if not book.slurm.usable_nodes():
        pytest.skip("no Slurm cluster answers here (make cluster)")
    with pytest.raises(book.slurm.SlurmError, match="Slurm knows no job 99999; check the job id."):
        book.slurm.job(99999)


def test_a_job_with_fewer_tasks_than_num_tasks_is_named_not_read_as_clean_exits(
    stand_ins, tmp_path
):
    stand_ins("scontrol", "print('JobId=9 JobState=COMPLETED ExitCode=0:0 NumTasks=2')\n")
    out = tmp_path / "train_job-9.out"
    out.write_text("0: step 1\n1: step 1\n")
    job = book.jobs.SlurmJob(9, "train.py", 3, out, timeout=60, submitted=time.time())
    with pytest.raises(ReaderError, match="had 2 task\\(s\\) .* but num_tasks is 3") as caught:
        job.wait_for_exits()
    assert "\n" not in str(caught.value)


def test_srun_reports_of_grouped_tasks_give_every_task_its_status(stand_ins, tmp_path):
    stand_ins("scontrol", "print('JobId=9 JobState=FAILED ExitCode=1:0 NumTasks=6')\n")
    out = tmp_path / "train_job-9.out"
    out.write_text(  # srun groups a node's tasks that ended alike
        "srun: error: n1: tasks 0-1: Killed\n"
        "srun: error: n2: tasks 2,3: Exited with exit code 3\n"
        "srun: error: n3: task 5: Terminated\n"
    )
    job = book.jobs.SlurmJob(9, "train.py", 6, out, timeout=60, submitted=time.time())
    assert job.wait_for_exits() == [-9, -9, 3, 3, 0, -15]
    out.write_text("srun: error: n1: tasks 0-2: Killed\n")
    job = book.jobs.SlurmJob(9, "train.py", 2, out, timeout=60, submitted=time.time())
    with pytest.raises(ReaderError, match="srun reports task 2 of job 9, but num_tasks is 2"):
        job.wait_for_exits()


def test_a_refused_scancel_is_said_and_an_ended_job_is_not(stand_ins):
    stand_ins(
        "scancel",
        "print('scancel: error: Kill job error on job id 12: Access/permission denied',"
        " file=sys.stderr)\nsys.exit(1)\n",
    )
    with pytest.raises(SlurmError, match="scancel 12 failed with exit code 1, so the job may"):
        book.slurm.cancel(12)
    stand_ins(
        "scancel",
        "print('scancel: error: Kill job error on job id 12: Job/step already completing or "
        "completed', file=sys.stderr)\nsys.exit(1)\n",
    )
    assert book.slurm.cancel(12) is None  # it had ended: nothing to say


def test_a_step_past_its_timeout_is_stopped_with_what_it_started(stand_ins, tmp_path):
    task = tmp_path / "task.py"
    task.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    stand_ins(
        "srun",
        "import subprocess\nsubprocess.run([sys.executable, sys.argv[-1]])\n",  # a child runs on
    )
    with pytest.raises(SlurmError, match="still ran after 1 s, so it was stopped"):
        book.slurm.step(["srun", "--label", "python3", str(task)], num_tasks=1, timeout=1)
    time.sleep(0.5)
    running = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(task).encode() in cmdline.read_bytes():
                running.append(cmdline.parent.name)
        except OSError:  # a process that ended meanwhile
            pass
    assert running == []


@pytest.mark.parametrize("printed", ["-5", "0", "+7", "1_2", "\u0661\u0662", "7.0", "12 "])
def test_sbatch_output_that_is_no_job_id_is_refused(stand_ins, tmp_path, monkeypatch, printed):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sbatch").write_text("#!/bin/sh\nsrun true\n")
    stand_ins("sbatch", f"print({printed!r})\n")
    if printed == "12 ":  # blanks around it are stripped: a job id still
        job, _ = book.jobs.submit("job.sbatch", "t.py")
        assert job.id == 12
        return
    with pytest.raises(ReaderError, match="not a job id"):
        book.jobs.submit("job.sbatch", "t.py")
