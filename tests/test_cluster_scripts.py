"""The cluster scripts of chapter 11: valid bash, and they start the worker the chapter runs."""

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
WORKER = "multihost_worker.py"
SCRIPTS = ["slurm_job.sbatch", "tpu_slice.sh"]


def commands(path: Path) -> list[list[str]]:
    """The script's commands as word lists: comments dropped, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [shlex.split(line) for line in lines if line and not line.startswith("#")]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_is_valid_bash(name):
    done = subprocess.run(["bash", "-n", str(NOTEBOOKS / name)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_chapter_launches_the_worker_the_scripts_start():
    nb = json.loads((NOTEBOOKS / "11_multi_controller.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert f'worker = Path("{WORKER}")' in code
    assert "book.multihost.launch(worker, num_processes=2, devices_per_process=4)" in code
    assert "book.multihost.launch(worker, env=as_slurm)" in code
    assert (NOTEBOOKS / WORKER).is_file()
    for name in SCRIPTS:
        assert f'Path("{name}")' in code, f"the chapter does not show {name}"


def test_slurm_job_asks_for_nodes_tasks_and_gpus_and_sruns_the_worker():
    script = NOTEBOOKS / "slurm_job.sbatch"
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n")
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))
    assert directives["nodes"] == "2"
    assert directives["ntasks-per-node"] == "4"
    assert directives["gpus-per-task"] == "1"
    runs = [c for c in commands(script) if c[0] == "srun"]
    assert len(runs) == 1 and runs[0][-2:] == ["python", f"notebooks/{WORKER}"]
    # One GPU per task shows up as device 0 in that task; JAX must be told.
    assert ["export", "JAX_LOCAL_DEVICE_IDS=0"] in commands(script)


def test_tpu_slice_copies_the_worker_and_runs_it_on_every_host():
    script = NOTEBOOKS / "tpu_slice.sh"
    steps = [c for c in commands(script) if c[:3] == ["gcloud", "compute", "tpus"]]
    verbs = [c[4] for c in steps]
    assert verbs == ["create", "ssh", "scp", "ssh", "delete"]
    copy = steps[2]
    assert f"notebooks/{WORKER}" in copy and "--worker=all" in copy
    run = steps[3]
    assert "--worker=all" in run and f"--command=python3 {WORKER}" in run
    assert all("--worker=all" in c for c in steps if c[4] in ("ssh", "scp"))
