"""book.jobs.submit: a batch job on the local Slurm cluster, watched, signalled and waited for.

Skipped where no cluster answers (``make cluster`` starts one). The tasks run a small Python
script without JAX: each prints its task index, then sleeps; SIGTERM makes it print a line and
exit cleanly, as a preempted training program does.
"""

import signal
import sys
import textwrap

import pytest

import book.jobs
import book.slurm
from book.multihost import WorkerError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not book.slurm.usable_nodes(), reason="no Slurm cluster answers here (make cluster)"
    ),
]

TASK = textwrap.dedent(
    """
    import os, signal, sys, time
    me = os.environ["SLURM_PROCID"]
    def preempted(*_):
        print(f"task {me} got SIGTERM", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, preempted)
    print(f"task {me} started", flush=True)
    if "fail" in sys.argv and me == "1":
        raise SystemExit("task 1 cannot go on")
    time.sleep(120)
    """
)
BATCH = textwrap.dedent(
    """\
    #!/bin/bash
    #SBATCH --nodes=2
    #SBATCH --ntasks-per-node=1
    #SBATCH --time=3
    PYTHON="$1"
    shift
    srun --label --kill-on-bad-exit=1 --error="%x-%j-%t.err" "$PYTHON" -u task.py "$@"
    """
)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "task.py").write_text(TASK)
    (tmp_path / "job.sbatch").write_text(BATCH)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_scancel_sends_every_task_sigterm_and_the_job_completes(folder):
    job, command = book.jobs.submit("job.sbatch", "task.py", [sys.executable], timeout=90)
    assert command.startswith("sbatch --parsable") and "job.sbatch" in command
    with job:
        job.wait_for(r"^task 0 started$", process=0)
        job.wait_for(r"^task 1 started$", process=1)
        assert job.signal(signal.SIGTERM) == f"scancel --signal=TERM {job.id}"
        outputs = job.wait()
    assert [out.splitlines()[-1] for out in outputs] == [f"task {i} got SIGTERM" for i in (0, 1)]
    assert job.facts["JobState"] == "COMPLETED"


def test_one_task_killed_ends_the_job_and_its_status_is_read(folder):
    job, _ = book.jobs.submit("job.sbatch", "task.py", [sys.executable], timeout=90)
    with job:
        job.wait_for(r"^task 1 started$", process=1)
        assert job.signal(signal.SIGKILL, process=1).startswith("kill -KILL ")
        exits = job.wait_for_exits()
    assert exits[1] == -signal.SIGKILL and set(job.ended) == {0, 1}


def test_a_failed_task_is_reported_with_its_own_errors(folder):
    job, _ = book.jobs.submit("job.sbatch", "task.py", [sys.executable, "fail"], timeout=90)
    with job, pytest.raises(WorkerError) as caught:
        job.wait()
    assert caught.value.process == 1 and "task 1 cannot go on" in str(caught.value)


def test_a_job_cancelled_by_its_with_block_is_not_signalled_or_waited_for(folder):
    job, _ = book.jobs.submit("job.sbatch", "task.py", [sys.executable], timeout=90)
    with job:
        job.wait_for(r"^task 1 started$", process=1)
        job.signal(signal.SIGCONT, process=1)  # its pid now known
    for call in (
        lambda: job.signal(signal.SIGTERM, process=1),
        lambda: job.signal(signal.SIGTERM),
        job.wait,
        job.wait_for_exits,
        lambda: job.wait_for("x"),
    ):
        with pytest.raises(book.jobs.ReaderError, match="ended with its with block"):
            call()


def test_a_batch_script_named_with_a_percent_sign_has_its_output_read(folder):
    (folder / "odd%j 50%.sbatch").write_text(BATCH)
    job, _ = book.jobs.submit("odd%j 50%.sbatch", "task.py", [sys.executable], timeout=90)
    with job:
        job.wait_for(r"^task 0 started$", process=0)
    assert job.output_file.name == f"odd%j 50%-{job.id}.out" and job.output_file.exists()


def test_a_task_signalled_after_it_ended_is_said_to_have_ended(folder):
    job, _ = book.jobs.submit("job.sbatch", "task.py", [sys.executable], timeout=90)
    with job:
        job.wait_for(r"^task 1 started$", process=1)
        job.signal(signal.SIGKILL, process=1)
        job.wait_for_exits()
        assert job.signal(signal.SIGTERM, process=1).startswith("nothing sent: task 1's process")


def test_a_script_the_tasks_do_not_run_is_named_before_the_timeout(folder):
    job, _ = book.jobs.submit("job.sbatch", "train.py", [sys.executable], timeout=90)
    with job:
        job.wait_for(r"^task 0 started$", process=0)
        with pytest.raises(book.jobs.ReaderError, match="no process of 'train.py'"):
            job.signal(signal.SIGTERM, process=0)
        assert book.slurm.job(job.id).get("JobState") == "RUNNING"  # not cancelled for it


def test_a_batch_script_named_like_an_option_is_submitted(folder):
    (folder / "-x.sbatch").write_text(BATCH)
    job, command = book.jobs.submit("-x.sbatch", "task.py", [sys.executable], timeout=90)
    assert "./-x.sbatch" in command
    with job:
        job.wait_for(r"^task 0 started$", process=0)


def test_a_task_printing_sruns_error_text_is_not_taken_for_srun(folder):
    (folder / "liar.py").write_text("print('srun: error: node9: task 0: Killed', flush=True)\n")
    (folder / "liar.sbatch").write_text(
        '#!/bin/bash\n#SBATCH --ntasks=1\n#SBATCH --time=2\nsrun --label "$1" -u liar.py\n'
    )
    job, _ = book.jobs.submit("liar.sbatch", "liar.py", [sys.executable], num_tasks=1, timeout=90)
    with job:
        assert job.wait_for_exits() == [0]
        job.wait()


def test_tasks_run_without_labels_are_named_not_read_as_silence(folder):
    (folder / "plain.sbatch").write_text(
        '#!/bin/bash\n#SBATCH --ntasks=1\n#SBATCH --time=2\n"$1" -c "print(\'tick\')"\n'
    )
    job, _ = book.jobs.submit("plain.sbatch", "tick", [sys.executable], num_tasks=1, timeout=90)
    with job, pytest.raises(book.jobs.ReaderError, match="no task labels"):
        job.wait()


def test_a_job_signalled_after_its_end_is_said_to_have_ended(folder):
    job, _ = book.jobs.submit("job.sbatch", "task.py", [sys.executable], timeout=90)
    with job:
        job.wait_for(r"^task 1 started$", process=1)
        job.signal(signal.SIGTERM)
        job.wait()
        assert job.signal(signal.SIGTERM) == f"nothing sent: job {job.id} had already ended"


def test_a_job_still_queued_at_its_timeout_is_said_to_wait_in_the_queue(folder):
    (folder / "big.sbatch").write_text(BATCH.replace("--nodes=2", "--nodes=5"))
    job, _ = book.jobs.submit("big.sbatch", "task.py", [sys.executable], timeout=5)
    with job, pytest.raises(WorkerError, match="still waiting in the queue"):
        job.wait()
    assert book.slurm.job(job.id).get("JobState") in book.slurm.ENDED
