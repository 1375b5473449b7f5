"""book.slurm: whether a cluster answers, a job's facts, waiting for it, a step's output by task.

Stand-ins for sinfo, scontrol and scancel (small scripts first on the PATH) give the answers a
cluster would; chapter 11 and tests/test_cluster_scripts.py run the real ones.
"""

import subprocess
import sys
import time

import pytest

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
        "7: from a task the caller did not count\n"
    )
    outputs = book.slurm.tasks(text, 2, "w.py")
    assert list(outputs) == ["process_index: 0\n", "process_index: 1\nsum: 3\n"]
    assert outputs.script == "w.py"
    assert book.slurm.tasks("", 2) == ["", ""]


def test_no_sinfo_or_a_failing_or_silent_one_means_no_cluster(stand_ins):
    assert book.slurm.usable_nodes() == []  # nothing on the PATH
    stand_ins("sinfo", "sys.exit(1)\n")
    assert book.slurm.usable_nodes() == []
    stand_ins("sinfo", "time.sleep(30)\n")
    start = time.monotonic()
    assert book.slurm.usable_nodes(timeout=0.5) == []
    assert time.monotonic() - start < 10


def test_usable_nodes_are_the_idle_and_partly_used_ones(stand_ins):
    stand_ins("sinfo", "print('node1 idle\\nnode2 alloc\\nnode3 mix*\\nnode4 down')\n")
    assert book.slurm.usable_nodes() == ["node1", "node3"]


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


def test_end_times_waits_for_the_first_ones_only():
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ended = book.slurm.end_times({"quick": quick, "slow": slow}, count=1, timeout=20)
        assert ended["slow"] is None and abs(ended["quick"] - time.time()) < 20
        with pytest.raises(SlurmError, match="Only 1 of the steps had ended after 0.3 s"):
            book.slurm.end_times({"quick": quick, "slow": slow}, count=2, timeout=0.3)
    finally:
        slow.kill()
        slow.wait()
        quick.wait()
