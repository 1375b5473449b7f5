"""The scripts of chapter 11, as its %%writefile cells write them: valid bash and Python, and the
cluster scripts start the worker the chapter launches.

The chapter writes every script it starts or shows itself, so that it runs wherever the notebook
is opened alone (Colab, Kaggle). These tests read the scripts from those cells.
"""

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pygments.lexers import get_lexer_by_name
from pygments.token import Error

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = ROOT / "notebooks" / "11_multi_controller.ipynb"
WORKER = "multihost_worker.py"
CLUSTER = ["slurm_job.sbatch", "tpu_slice.sh"]


def chapter_code() -> list[str]:
    nb = json.loads(CHAPTER.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def written_files() -> dict[str, str]:
    """What each ``%%writefile <name>`` cell of the chapter writes, by file name."""
    files = {}
    for source in chapter_code():
        first, _, body = source.partition("\n")
        words = first.split()
        if words[:1] == ["%%writefile"]:
            assert len(words) == 2, f"write the file whole, without options: {first}"
            assert words[1] not in files, f"two cells write {words[1]}"
            files[words[1]] = body + "\n"
    return files


def commands(text: str) -> list[list[str]]:
    """A script's commands as word lists: comments dropped, continuation lines joined."""
    text = re.sub(r"\\\n", " ", text)
    lines = [line.strip() for line in text.splitlines()]
    return [shlex.split(line) for line in lines if line and not line.startswith("#")]


def test_the_chapter_writes_every_script_it_launches_or_shows():
    files = written_files()
    assert set(files) == {WORKER, "multihost_train.py", "broken_worker.py", *CLUSTER}
    code = "\n".join(c for c in chapter_code() if not c.startswith("%%"))
    assert f'worker = Path("{WORKER}")' in code
    assert "book.multihost.launch(worker, num_processes=2, devices_per_process=4)" in code
    assert "book.multihost.launch(worker, env=as_slurm)" in code
    launched = set(re.findall(r"book\.multihost\.launch\((\w+)", code))
    assert len(launched) == 3
    for name in launched:
        path = re.search(rf'^{name} = Path\("([^"]+)"\)$', code, re.M)
        assert path, f"the chapter launches {name} but does not say which file it is"
        assert path.group(1) in files, f"the chapter launches {path.group(1)} without writing it"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("name", CLUSTER)
def test_cluster_script_is_valid_bash(name, tmp_path):
    script = tmp_path / name
    script.write_text(written_files()[name])
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_python_scripts_compile_and_pass_the_linter(tmp_path):
    """Ruff skips cells with cell magics, so the chapter's scripts are linted here instead."""
    scripts = {k: v for k, v in written_files().items() if k.endswith(".py")}
    for name, text in scripts.items():
        compile(text, name, "exec")
        (tmp_path / name).write_text(text)
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed next to this Python")
    config = ["--config", str(ROOT / "notebooks" / "ruff.toml")]
    paths = [str(tmp_path / name) for name in scripts]
    for args in (["check", "--no-cache"], ["format", "--check", "--no-cache"]):
        done = subprocess.run([str(ruff), *args, *config, *paths], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_page_can_highlight_every_script():
    """The page shows each %%writefile cell with the notebook's lexer, ipython3, whatever the
    file's language. A token that lexer cannot read (an unquoted ``$`` in bash) makes Sphinx
    warn, and the book is built with warnings as errors."""
    lexer = get_lexer_by_name("ipython3")
    for source in chapter_code():
        if source.startswith("%%writefile"):
            bad = [value for kind, value in lexer.get_tokens(source) if kind in Error]
            assert not bad, f"{source.split()[1]}: the page cannot highlight {bad[:5]}"


def test_slurm_job_asks_for_nodes_tasks_and_gpus_and_sruns_the_worker():
    text = written_files()["slurm_job.sbatch"]
    assert text.startswith("#!/bin/bash\n")
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))
    assert directives["nodes"] == "2"
    assert directives["ntasks-per-node"] == "4"
    assert directives["gpus-per-task"] == "1"
    runs = [c for c in commands(text) if c[0] == "srun"]
    assert len(runs) == 1 and runs[0][-2:] == ["python", WORKER]
    # One GPU per task shows up as device 0 in that task; JAX must be told.
    assert ["export", "JAX_LOCAL_DEVICE_IDS=0"] in commands(text)


def test_tpu_slice_copies_the_worker_and_runs_it_on_every_host():
    text = written_files()["tpu_slice.sh"]
    steps = [c for c in commands(text) if c[:3] == ["gcloud", "compute", "tpus"]]
    verbs = [c[4] for c in steps]
    assert verbs == ["create", "ssh", "scp", "ssh", "delete"]
    copy = steps[2]
    assert WORKER in copy and "--worker=all" in copy
    run = steps[3]
    assert "--worker=all" in run and f"--command=python3 {WORKER}" in run
    assert all("--worker=all" in c for c in steps if c[4] in ("ssh", "scp"))


def test_tpu_slice_is_the_one_the_chapter_describes():
    """A v4-32 slice: 16 chips on 4 hosts of 4, so the chapter's 4 processes and 16 devices.
    Its default type, runtime and zone go together, and the prose names the same slice."""
    text = written_files()["tpu_slice.sh"]
    defaults = dict(re.findall(r'^(\w+)="\$\{\w+:-([^}]+)\}"$', text, re.M))
    assert defaults["ACCELERATOR_TYPE"] == "v4-32"
    assert defaults["RUNTIME_VERSION"] == "tpu-ubuntu2204-base"
    assert defaults["ZONE"] == "us-central2-b"  # where Cloud TPU v4 is offered
    create = [
        c for c in commands(text) if c[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"]
    ]
    assert "--accelerator-type=$ACCELERATOR_TYPE" in create[0]
    assert "--version=$RUNTIME_VERSION" in create[0]
    assert "4 hosts of 4 chips: 4 JAX processes, 16 devices" in text
    nb = json.loads(CHAPTER.read_text())
    prose = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert "`v4-32`" in prose and "report `process_count: 4`" in prose
    assert "v5litepod" not in prose + text
