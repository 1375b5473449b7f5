"""`make cluster` and `make cluster-down`: a real two-node Slurm on this machine, started and
stopped exactly, safe to repeat, and one sentence where it cannot start.

Each test uses a cluster of its own (its own state folder and ports), so it never disturbs the
cluster the chapters of the same test run submit their jobs to.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "cluster" / "local_slurm.sh"
is_root = os.geteuid() == 0


def make(target: str, state: Path, port: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "CLUSTER_PORT": str(port)}
    return subprocess.run(
        ["make", "-s", "-C", str(ROOT), target, f"CLUSTER_DIR={state}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def daemons(state: Path) -> dict[str, int]:
    """The daemons a cluster started, by pid file, as their pids."""
    files = [*state.glob("*.pid"), *state.glob("munge/*.pid")]
    return {f.name: int(f.read_text()) for f in files}


@pytest.mark.skipif(not is_root or shutil.which("apt-get") is None, reason="needs root on Debian")
def test_cluster_up_twice_then_down_twice_leaves_nothing_running(tmp_path):
    state, port = tmp_path / "cluster", 7117
    hosts = Path("/etc/hosts").read_text()
    try:
        started = []
        for _ in range(2):
            up = make("cluster", state, port)
            assert up.returncode == 0, up.stdout + up.stderr
            started.append(daemons(state))
        first, again = started
        assert set(first) == {"slurmctld.pid", "slurmd-node1.pid", "slurmd-node2.pid", "munged.pid"}
        assert all(alive(pid) for pid in first.values())
        assert again == first  # a second `up` starts nothing new: the same daemons answer
        env = {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
        nodes = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True
        )
        assert nodes.stdout.split("\n")[:2] == ["node1 idle", "node2 idle"]
        boot_id = "$(cat /proc/sys/kernel/random/boot_id)"
        ran = subprocess.run(
            [
                "srun",
                "-N",
                "2",
                "-n",
                "2",
                "sh",
                "-c",
                f'echo "$SLURM_PROCID $SLURMD_NODENAME {boot_id}"',
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        tasks = sorted(line.split() for line in ran.stdout.split("\n")[:2])
        assert [task[:2] for task in tasks] == [["0", "node1"], ["1", "node2"]], ran.stderr
        # Each node is a machine of its own to JAX, which tells machines apart by boot_id.
        machine = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        assert len({task[2] for task in tasks} | {machine}) == 3
    finally:
        for _ in range(2):
            down = make("cluster-down", state, port)
            assert down.returncode == 0, down.stdout + down.stderr
    assert not any(alive(pid) for pid in first.values())
    assert not state.exists()
    assert Path("/etc/hosts").read_text() == hosts


def test_without_slurm_and_root_it_says_what_to_install_in_one_sentence(tmp_path):
    # The caller's PATH decides what is installed; /usr/bin and /bin hold no Slurm daemon.
    command = ["env", "PATH=/usr/bin:/bin", f"CLUSTER_DIR={tmp_path / 'cluster'}"]
    command += ["bash", "-s", "up"]
    if is_root:
        command = ["runuser", "-u", "nobody", "--", *command]
    # From /, which any user may enter: a clone made by mktemp -d is its owner's alone.
    done = subprocess.run(
        command, stdin=SCRIPT.open(), capture_output=True, text=True, timeout=30, cwd="/"
    )
    assert done.returncode == 1
    message = done.stderr.strip()
    assert message.count("\n") == 0 and message.endswith("."), message
    assert "sudo apt-get install slurm-wlm munge" in message
    assert not (tmp_path / "cluster").exists()


def test_a_wrong_command_gets_one_sentence():
    done = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip() == "cluster: say 'up' or 'down', e.g. bash cluster/local_slurm.sh up"
