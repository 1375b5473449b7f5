"""The scripts of chapter 11, as its %%writefile cells write them: valid bash and Python, and the
cluster scripts start the worker the chapter launches.

The chapter writes every script it starts or shows itself, so that it runs wherever the notebook
is opened alone (Colab, Kaggle). These tests read the scripts from those cells.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pygments.lexers import get_lexer_by_name
from pygments.token import Error

import book.multihost
import book.slurm

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = ROOT / "notebooks" / "11_multi_controller.ipynb"
WORKER = "multihost_worker.py"
CLUSTER = ["slurm_job.sbatch", "cpu_job.sbatch", "tpu_slice.sh"]


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
    return [shlex.split(line, comments=True) for line in lines if line and not line.startswith("#")]


def test_the_chapter_writes_every_script_it_launches_or_shows():
    files = written_files()
    launched_scripts = {WORKER, "multihost_train.py", "broken_worker.py", "stuck_worker.py"}
    launched_scripts.add("mesh_worker.py")
    assert set(files) == {*launched_scripts, *CLUSTER}
    code = "\n".join(c for c in chapter_code() if not c.startswith("%%"))
    assert f'worker = Path("{WORKER}")' in code
    assert "book.multihost.launch(worker, num_processes=2, devices_per_process=4)" in code
    launched = set(re.findall(r"book\.multihost\.launch\((\w+)", code))
    assert len(launched) == 5
    # Where a cluster answers, srun starts the tour's worker, the failing one and the mesh.
    started = set(re.findall(r"(?<!def )\bsrun\((\w+)", code))
    assert started == {"worker", "broken", "mesh_worker"}
    assert '"sbatch", "--parsable", "cpu_job.sbatch", sys.executable' in code
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


def pinned_jax() -> str:
    """The jax version requirements.txt pins, which the cluster scripts install."""
    found = re.search(r"^jax==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M)
    assert found, "requirements.txt pins no jax"
    return found.group(1)


def stand_in(folder: Path, name: str) -> Path:
    """An executable ``name`` that logs each call's arguments as one JSON line.

    It fails when its arguments contain ``$FAIL_AT``, and sends SIGTERM to the script that
    called it when they contain ``$TERM_AT``: a failed step and an interrupt.
    """
    path = folder / name
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, signal, sys\n"
        "args = sys.argv[1:]\n"
        "with open(os.environ['CALLS'], 'a') as log:\n"
        "    log.write(json.dumps(args) + '\\n')\n"
        "text = ' '.join(args)\n"
        "if os.environ.get('TERM_AT') and os.environ['TERM_AT'] in text:\n"
        "    os.kill(os.getppid(), signal.SIGTERM)\n"
        "if os.environ.get('FAIL_AT') and os.environ['FAIL_AT'] in text:\n"
        "    sys.exit(1)\n"
    )
    path.chmod(0o755)
    return path


def run_script(name, tmp_path, stand_ins, **env):
    """Run one of the chapter's cluster scripts with stand-ins for the cluster's commands."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for command in stand_ins:
        stand_in(bin_dir, command)
    script = tmp_path / name
    script.write_text(written_files()[name])
    (tmp_path / WORKER).write_text(written_files()[WORKER])
    calls = tmp_path / "calls.jsonl"
    calls.write_text("")
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TPU_"))}
    for k in ("ZONE", "ACCELERATOR_TYPE", "RUNTIME_VERSION"):
        keep.pop(k, None)
    full_env = {
        **keep,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path),
        "CALLS": str(calls),
        **env,
    }
    done = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=full_env, capture_output=True, text=True
    )
    logged = [json.loads(line) for line in calls.read_text().splitlines()]
    return done, logged


def test_slurm_job_asks_for_nodes_tasks_and_gpus_and_sruns_the_worker():
    text = written_files()["slurm_job.sbatch"]
    assert text.startswith("#!/bin/bash\n")
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))
    assert directives["nodes"] == "2"
    assert directives["ntasks-per-node"] == "4"
    assert int(directives["nodes"]) * int(directives["ntasks-per-node"]) == 8
    # Every task sees its node's 4 GPUs, so NCCL can use NVLink (NVIDIA/nccl#1066).
    assert directives["gpus-per-node"] == "4" and "gpus-per-task" not in directives
    assert f'"jax[cuda12]=={pinned_jax()}"' in text


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_slurm_job_checks_its_tasks_then_runs_the_worker_in_each(tmp_path):
    """The batch script's commands, run by bash with a stand-in srun that logs its calls."""
    done, calls = run_script("slurm_job.sbatch", tmp_path, ["srun"], SLURM_CPUS_PER_TASK="8")
    assert done.returncode == 0, done.stderr
    sanity, job = calls
    # First one line per task: its rank and the GPU it sees.
    assert sanity[:3] == ["--label", "bash", "-c"]
    assert "$SLURM_PROCID" in sanity[3] and "$CUDA_VISIBLE_DEVICES" in sanity[3]
    # Then the worker, every task ended as soon as one fails.
    assert "--kill-on-bad-exit=1" in job
    assert job[-2:] == [f"{tmp_path}/jax-env/bin/python", WORKER]
    commands_run = commands(written_files()["slurm_job.sbatch"])
    # JAX drives GPU SLURM_LOCALID of the node's 4: nothing to restrict by hand.
    assert not any(
        line[:1] == ["export"] and "JAX_LOCAL_DEVICE_IDS" in line[1] for line in commands_run
    )
    assert ["export", "SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK"] in commands_run
    # The worker keeps JAX's defaults (a preempted job can checkpoint); the comment says how
    # a failure would end the job at once, with broken_worker.py's hook.
    assert not any("JAX_ENABLE_PREEMPTION_SERVICE" in " ".join(line) for line in commands_run)
    text = written_files()["slurm_job.sbatch"]
    assert "Slurm ends the others at once" not in text
    assert "One task per node: JAX_LOCAL_DEVICE_IDS=0,1,2,3" in text
    assert "as broken_worker.py does" in text


def test_the_cpu_twin_asks_for_the_local_cluster_and_runs_the_same_worker():
    """cpu_job.sbatch is slurm_job.sbatch for `make cluster`'s two nodes of 4 claimed CPUs."""
    text = written_files()["cpu_job.sbatch"]
    assert text.startswith("#!/bin/bash\n")
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))
    assert directives["nodes"] == "2" and directives["ntasks-per-node"] == "1"
    assert directives["job-name"].startswith("ch11-")
    assert directives["output"] == "%x-%j.out" and "time" in directives
    assert directives["error"] == "%x-%j.err"  # errors apart from what the tasks print
    assert "gpus-per-task" not in directives
    twin = commands(text)
    exports = [word for line in twin if line[0] == "export" for word in line[1:]]
    assert {"JAX_PLATFORMS=cpu", "JAX_NUM_CPU_DEVICES=4"} <= set(exports)
    assert {"JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo"} <= set(exports)
    assert not any("PREEMPTION" in word for word in exports)  # JAX's defaults, as on GPUs
    gpu_run = commands(written_files()["slurm_job.sbatch"])[-1]
    assert twin[-1] == gpu_run  # the same srun line starts the same worker


def gcloud_steps(calls):
    """(verb, the call) for every gcloud compute tpus tpu-vm call, in order."""
    steps = []
    for call in calls:
        assert call[:3] == ["compute", "tpus", "tpu-vm"], call
        steps.append((call[3], call))
    return steps


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_tpu_slice_installs_copies_runs_the_worker_on_every_host_and_deletes(tmp_path):
    done, calls = run_script("tpu_slice.sh", tmp_path, ["gcloud"])
    assert done.returncode == 0, done.stderr
    steps = gcloud_steps(calls)
    assert [verb for verb, _ in steps] == ["create", "ssh", "scp", "ssh", "delete"]
    install, copy, run = steps[1][1], steps[2][1], steps[3][1]
    assert all("--worker=all" in call for call in (install, copy, run))
    # A Python recent enough for the pinned jax, and that jax, on every host.
    command = next(a for a in install if a.startswith("--command="))
    assert "uv venv --python 3.12 ~/jax-env" in command
    assert f"'jax[tpu]=={pinned_jax()}'" in command
    assert WORKER in copy
    assert "--command=~/jax-env/bin/python multihost_worker.py" in run


def test_the_python_the_tpu_script_installs_is_one_the_pinned_jax_supports():
    from importlib.metadata import metadata, version

    from packaging.specifiers import SpecifierSet

    if version("jax") != pinned_jax():
        pytest.skip("the installed jax is not the one requirements.txt pins")
    text = written_files()["tpu_slice.sh"]
    python = re.search(r"uv venv --python (\S+)", text).group(1)
    assert python in SpecifierSet(metadata("jax")["Requires-Python"])


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    "fail_at, term_at",
    [("pip install", None), ("multihost_worker.py", None), (None, "multihost_worker.py")],
    ids=["install fails", "worker fails", "interrupted"],
)
def test_tpu_slice_is_deleted_however_the_script_ends(tmp_path, fail_at, term_at):
    """A slice is billed while it exists: after a failed step or an interrupt, the script's
    last act must still be deleting it."""
    env = {"FAIL_AT": fail_at} if fail_at else {"TERM_AT": term_at}
    done, calls = run_script("tpu_slice.sh", tmp_path, ["gcloud"], **env)
    assert done.returncode != 0
    verbs = [verb for verb, _ in gcloud_steps(calls)]
    assert verbs[0] == "create" and verbs[-1] == "delete" and verbs.count("delete") == 1
    assert "delete" not in verbs[:-1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    "accelerator, runtime",
    [
        ("v4-32", "tpu-ubuntu2204-base"),
        ("v5p-32", "v2-alpha-tpuv5"),
        ("v5litepod-16", "v2-alpha-tpuv5-lite"),
        ("v6e-16", "v2-alpha-tpuv6e"),
    ],
)
def test_tpu_slice_picks_the_runtime_of_each_tpu_generation(tmp_path, accelerator, runtime):
    """Google's table of TPU software versions: one base image per generation."""
    done, calls = run_script("tpu_slice.sh", tmp_path, ["gcloud"], ACCELERATOR_TYPE=accelerator)
    assert done.returncode == 0, done.stderr
    verb, create = gcloud_steps(calls)[0]
    assert verb == "create"
    assert f"--accelerator-type={accelerator}" in create
    assert f"--version={runtime}" in create


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_tpu_slice_creates_nothing_for_an_unknown_accelerator(tmp_path):
    done, calls = run_script("tpu_slice.sh", tmp_path, ["gcloud"], ACCELERATOR_TYPE="v9-8")
    assert done.returncode != 0 and calls == []
    assert "RUNTIME_VERSION" in done.stderr


def test_tpu_slice_is_the_one_the_chapter_describes():
    """A v4-32 slice: 16 chips on 4 hosts of 4, so the chapter's 4 processes and 16 devices.
    Its default type and zone go together, and the prose names the same slice."""
    text = written_files()["tpu_slice.sh"]
    defaults = dict(re.findall(r'^(\w+)="\$\{\w+:-([^}$]+)\}"$', text, re.M))
    assert defaults["ACCELERATOR_TYPE"] == "v4-32"
    assert defaults["ZONE"] == "us-central2-b"  # where Cloud TPU v4 is offered
    assert f'JAX_VERSION="{pinned_jax()}"' in text
    assert "4 hosts of 4 chips: 4 JAX processes, 16 devices" in text
    nb = json.loads(CHAPTER.read_text())
    prose = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert "`v4-32`" in prose and "report `process_count: 4`" in prose
    assert "not run on a real cluster" in prose


def test_the_page_shows_each_script_without_the_notice_that_it_was_written():
    """A %%writefile cell prints "Writing x" or "Overwriting x"; the page leaves that out."""
    nb = json.loads(CHAPTER.read_text())
    for cell in nb["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "code" and text.startswith("%%writefile"):
            tags = cell["metadata"].get("tags", [])
            assert "remove-output" in tags, f"{text.split()[1]} shows its write notice"


cluster = pytest.mark.skipif(
    not book.slurm.usable_nodes(), reason="no Slurm cluster answers here (make cluster)"
)


CPU_GLOO = "JAX_PLATFORMS=cpu,JAX_NUM_CPU_DEVICES=4,JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo"


def submit(folder: Path, name: str, worker: str, time: str, run: str) -> int:
    """Submit one of chapter 11's workers from folder as a 2-node batch job named
    ch11-test-<name>, under --time, with run the srun line that starts it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / worker).write_text(written_files()[worker])
    script = folder / f"{name}.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --job-name=ch11-test-{name}\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
        f"#SBATCH --time={time}\n#SBATCH --output=%x-%j.out\n"
        f"export {CPU_GLOO.replace(',', ' ')}\n{run}\n"
    )
    out = book.slurm.run(["sbatch", "--parsable", f"--chdir={folder}", str(script)])
    return int(out.split(";")[0])


def submit_deadlock(folder: Path) -> int:
    """Chapter 11's deadlocked job: two tasks of stuck_worker.py, which wait in an
    all-gather one of them never joins, under a one-minute --time. stuck_worker.py reads
    its rank from JAX_* variables, as launch sets them: srun's are passed on."""
    port = book.multihost.free_port()
    run = (
        f"export JAX_NUM_PROCESSES=2 JAX_COORDINATOR_ADDRESS=127.0.0.1:{port}\n"
        "srun --label bash -c 'JAX_PROCESS_ID=$SLURM_PROCID exec \"$0\" stuck_worker.py' "
        f"{sys.executable}"
    )
    return submit(folder, "hang", "stuck_worker.py", "0:10", run)


def submit_failing(folder: Path) -> int:
    """Chapter 11's failing job: two tasks of broken_worker.py, one of which raises while
    the other waits for it in a collective, under JAX's defaults."""
    run = f"srun --label --kill-on-bad-exit=1 {sys.executable} broken_worker.py"
    return submit(folder, "fail", "broken_worker.py", "2", run)


SUBMITTERS = {"deadlock": submit_deadlock, "failing": submit_failing}


@pytest.mark.slow
@pytest.mark.early
@cluster
def test_the_slow_jobs_are_submitted_before_the_chapters(run_folder):
    """The deadlocked job's minute and the failing job's wait for gloo pass while the
    chapters run (conftest runs this first); the test below reads how they ended."""
    for name, submit in SUBMITTERS.items():
        job_id = submit(run_folder / name)
        assert book.slurm.job(job_id)["JobState"] not in {"FAILED", "CANCELLED", "NODE_FAIL"}
        (run_folder / name / "job").write_text(str(job_id))


def early_job(run_folder: Path, name: str) -> int | None:
    """The job submitted at the start of this run, while Slurm keeps its record."""
    try:
        job_id = int((run_folder / name / "job").read_text())
        return job_id if book.slurm.job(job_id).get("JobState") else None
    except (OSError, book.slurm.SlurmError):
        return None


@pytest.mark.slow
@cluster
def test_on_slurm_jax_defaults_wait_for_gloo_and_a_hung_job_for_its_time_limit(
    tmp_path, run_folder
):
    """What chapter 11 says but cannot wait for: under JAX's defaults a task that raises ends
    its job only when gloo gives up on the collective the others wait in (about 30 s), and a
    deadlocked job ends at its --time, which Slurm counts in whole minutes and checks every so
    often. Each job is the one submitted at the start of the run, or, where that one is not
    on record, one submitted now; both are cancelled if they outlive the test."""
    jobs = {}
    try:
        for name, submit in SUBMITTERS.items():
            job_id, folder = early_job(run_folder, name), run_folder / name
            if job_id is None:  # run alone, or the early job's record is gone
                job_id, folder = submit(tmp_path / name), tmp_path / name
            jobs[name] = job_id, folder
        fail_id, folder = jobs["failing"]
        facts = book.slurm.wait(fail_id, timeout=120)
        log = (folder / f"ch11-test-fail-{fail_id}.out").read_text()
        raised = float(re.search(r"fails at: ([\d.]+)", log).group(1))
        # Slurm's end time is in whole seconds: the task ended within the second after it.
        ended = time.mktime(time.strptime(facts["EndTime"], "%Y-%m-%dT%H:%M:%S"))
        assert 24 < ended - raised < 60, log  # gloo's 30 s set-up timeout
        assert "FileNotFoundError" in log and facts["JobState"] == "FAILED"
        hang_id, folder = jobs["deadlock"]
        facts = book.slurm.wait(hang_id, timeout=240)
        assert facts["TimeLimit"] == "00:01:00"  # --time=0:10, rounded up to a minute
        assert facts["JobState"] == "TIMEOUT" and facts["Reason"] == "TimeLimit"
        # Started to ended: the limit, then up to Slurm's next check and the KillWait.
        start, end = (
            time.mktime(time.strptime(facts[k], "%Y-%m-%dT%H:%M:%S"))
            for k in ("StartTime", "EndTime")
        )
        assert 60 <= end - start <= 120, facts
        output = (folder / f"ch11-test-hang-{hang_id}.out").read_text()
        assert "gathering x (an all-gather)" in output and "TIME LIMIT" in output
    finally:
        for job_id, _ in jobs.values():
            book.slurm.cancel(job_id)
