"""Chapter 19's train.py, as its %%writefile cell writes it, on the paths the chapter only states.

The chapter kills process 0, which also runs JAX's coordination service, and watches process 1
abort at once. When a process other than the coordinator dies, the survivor's next Gloo
collective fails as the dead peer's connection resets, and train.py leaves with os._exit(1),
although JAX's preemption service is on (it would swallow a scheduler's SIGTERM). The batch
script the chapter prints for a GPU cluster is run here with stand-ins for srun and scontrol.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import book.multihost

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = ROOT / "notebooks" / "19_a_training_run.ipynb"
HEARTBEAT = 3


@pytest.fixture
def train_py(tmp_path):
    """train.py as the chapter writes it, in a folder of its own."""
    cells = json.loads(CHAPTER.read_text())["cells"]
    (source,) = [
        "".join(c["source"])
        for c in cells
        if c["cell_type"] == "code" and "".join(c["source"]).startswith("%%writefile train.py")
    ]
    path = tmp_path / "train.py"
    path.write_text(source.partition("\n")[2] + "\n")
    return path


@pytest.fixture
def train(train_py, monkeypatch):
    """train.py imported as a module, to run in this process alone."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("chapter19_train", train_py)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.delenv("JAX_NUM_PROCESSES", raising=False)
    monkeypatch.delenv("SLURM_STEP_NODELIST", raising=False)
    return module


@pytest.mark.parametrize(
    "bad",
    [
        ["--steps", "-4"],  # refused by argparse, after the folders' flags were read
        ["--mesh", "3x3"],  # refused by main: not the 8 devices
        ["--steps", "1000000"],  # refused by main: more records than the data set has
        ["--dump", "train.py/dump"],  # under a file: no folder can be made there
        ["--log-dir", ""],  # no name: not the folder train.py was started in
        ["--log-dir", "x/" + "y" * 300],  # a name too long, under a folder it would make
        ["--checkpoint-dir", "c\udcff"],  # a name not in UTF-8, which orbax cannot write
    ],
)
def test_a_refused_flag_leaves_no_folder_behind(train, tmp_path, monkeypatch, capsys, bad):
    monkeypatch.chdir(tmp_path)  # where train.py lies
    folders = ["--checkpoint-dir", "c/d", "--log-dir", "log", "--profile", "p"]
    with pytest.raises(SystemExit) as stop:
        train.main(train.parser.parse_args(["--steps", "4", *folders, *bad]))
    said = (capsys.readouterr().err or str(stop.value.code)).strip().splitlines()
    assert said[-1].startswith("train.py: error:") and "Traceback" not in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_a_folder_where_the_run_writes_a_file_is_named(train_py, tmp_path):
    (tmp_path / "out" / "step.hlo").mkdir(parents=True)
    flags = ["--steps", "2", "--batch", "32", "--dump", tmp_path / "out"]
    folders = ["--checkpoint-dir", tmp_path / "c", "--compile-cache", tmp_path / "cache"]
    with pytest.raises(book.multihost.WorkerError) as failed:
        book.multihost.launch(train_py, 1, 8, timeout=120, args=[*flags, *folders])
    assert failed.value.exit_code == 1 and "Traceback" not in str(failed.value)
    assert "out/step.hlo is a folder; move it" in str(failed.value)


def test_a_mesh_that_cannot_split_the_model_evenly_is_refused(train_py, tmp_path):
    # 6 devices: FSDP would split d_model (64) six ways. One process, so no peer waits.
    flags = ["--layout", "FSDP", "--steps", "2", "--batch", "24"]
    folders = ["--checkpoint-dir", tmp_path / "c", "--compile-cache", tmp_path / "cache"]
    with pytest.raises(book.multihost.WorkerError) as failed:
        book.multihost.launch(train_py, 1, 6, timeout=120, args=[*flags, *folders])
    assert failed.value.exit_code == 1 and "Traceback" not in str(failed.value)
    assert "splits the model unevenly; change --layout" in str(failed.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


@pytest.mark.parametrize("left", [[], ["state"]])  # an empty step folder, or one item of two
def test_a_checkpoint_that_cannot_be_restored_is_named_not_a_traceback(train_py, tmp_path, left):
    for item in ["", *left]:
        (tmp_path / "c" / "step_7" / item).mkdir(parents=True, exist_ok=True)
    args = ["--steps", "8", "--checkpoint-dir", tmp_path / "c", "--compile-cache", tmp_path / "x"]
    with pytest.raises(book.multihost.WorkerError) as failed:
        book.multihost.launch(train_py, 1, 8, timeout=120, args=args)
    said = str(failed.value).splitlines()[-1].strip()
    assert failed.value.exit_code == 1 and said.startswith("train.py: error: checkpoint 7: ")
    assert "Traceback" not in str(failed.value) and "delete" not in said


def test_a_resume_with_too_few_records_left_is_refused_in_one_line(train_py, tmp_path):
    small = ["--batch", "8", "--microbatches", "1", "--seq", "4", "--checkpoint-every", "2"]
    folders = ["--checkpoint-dir", tmp_path / "c", "--compile-cache", tmp_path / "x"]
    book.multihost.launch(train_py, 1, 8, timeout=120, args=["--steps", "2", *small, *folders])
    # As a run with a larger --batch leaves it: the data set nearly read.
    (metadata,) = (tmp_path / "c" / "step_2" / "data").glob("metadata*")
    metadata.write_text(json.dumps({"global_next_index": 2**20 - 6}))
    with pytest.raises(book.multihost.WorkerError) as failed:
        book.multihost.launch(train_py, 1, 8, timeout=120, args=["--steps", "3", *small, *folders])
    said = str(failed.value).splitlines()[-1].strip()
    assert failed.value.exit_code == 1 and "Traceback" not in str(failed.value)
    assert (
        said.startswith("train.py: error: checkpoint 2: ")
        and "6 records are left: lower --steps or --batch" in said
    )


def test_a_checkpoint_past_steps_is_refused_not_taken_as_done(train_py, tmp_path):
    (tmp_path / "c" / "step_7").mkdir(parents=True)  # --steps counts the whole run
    args = ["--steps", "4", "--checkpoint-dir", tmp_path / "c", "--compile-cache", tmp_path / "x"]
    with pytest.raises(book.multihost.WorkerError) as failed:
        book.multihost.launch(train_py, 1, 8, timeout=120, args=args)
    said = str(failed.value).splitlines()[-1].strip()
    assert failed.value.exit_code == 1 and "Traceback" not in str(failed.value)
    assert said == f"train.py: error: {tmp_path / 'c'} is at step 7; raise --steps"


@pytest.mark.parametrize("url", ["gs://bucket/run", "gs:/bucket/run", "s3://b"])
def test_a_bucket_url_is_refused_as_no_folder(train, capsys, url):
    with pytest.raises(SystemExit):
        train.parser.parse_args(["--steps", "2", "--checkpoint-dir", url])
    assert f"No folder can be made at '{url}'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, inside",
    [("--log-dir", "9"), ("--dump", "step_9"), ("--dump", "../x/../c/step_9"), ("--dump", "")],
)
def test_a_folder_inside_the_checkpoints_is_refused(train, tmp_path, capsys, flag, inside):
    # orbax would take a folder there named like a step for a checkpoint, written or not;
    # also reached through "..", or the checkpoint folder itself.
    c = tmp_path / "c"
    args = ["--steps", "2", "--checkpoint-dir", str(c), flag, str(c / inside)]
    with pytest.raises(SystemExit) as stop:
        train.main(train.parser.parse_args(args))
    assert str(stop.value.code) == (
        "train.py: error: keep the other folders out of --checkpoint-dir"
    )
    assert not c.exists() and "Traceback" not in capsys.readouterr().err


def test_a_link_into_the_checkpoints_is_refused(train, tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "c")
    args = ["--steps", "2", "--checkpoint-dir", str(tmp_path / "c")]
    args += ["--dump", str(tmp_path / "link" / "step_9")]
    with pytest.raises(SystemExit, match="keep the other folders out of --checkpoint-dir"):
        train.main(train.parser.parse_args(args))
    assert not (tmp_path / "c" / "step_9").exists()


@pytest.mark.slow
def test_a_dead_peer_that_is_not_the_coordinator_fails_the_others_collective(train_py, tmp_path):
    flags = ["--steps", "200", "--checkpoint-every", "100", "--checkpoint-dir", tmp_path / "c"]
    flags += ["--heartbeat-timeout", HEARTBEAT, "--batch", "8"]
    with book.multihost.start(train_py, 2, 1, timeout=240, args=flags) as job:
        job.wait_for(r"^step 2 ", process=0)
        killed = time.monotonic() - job.started
        job.signal(signal.SIGKILL, process=1)
        exits = job.wait_for_exits()
    # Over Gloo the survivor's next all-reduce fails as the dead peer's connection resets,
    # and train.py leaves with os._exit(1), long before the heartbeat timeout would abort it
    # (chapter 19 says which collectives block instead).
    assert exits[1] == -signal.SIGKILL and exits[0] == 1, exits
    assert job.ended[0] - killed < HEARTBEAT + 10


def test_plain_accumulation_reduces_the_gradients_in_every_microbatch():
    """What chapter 19 says of chapter 16's accumulation, on chapter 13's model in bfloat16:
    summed in a scan carry, the gradients are all-reduced inside the loops, not once after."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import book.hlo
    from book.lessons.transformer import PARAM_AXES, RULES, Config, Layout, forward, init_params

    cfg = Config()
    mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,), devices=jax.devices()[:4])
    layout = Layout(mesh, RULES["DP"])

    def loss_fn(params, tokens):
        low = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
        logits = forward(low, tokens[:, :-1], cfg, layout).astype(jnp.float32)
        log_probs = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1))

    def accumulate(params, tokens):
        def add(total, microbatch):
            return jax.tree.map(jnp.add, total, jax.grad(loss_fn)(params, microbatch)), None

        return jax.lax.scan(add, jax.tree.map(jnp.zeros_like, params), tokens)[0]

    shardings = jax.tree.map(layout.sharding, PARAM_AXES, is_leaf=lambda x: isinstance(x, tuple))
    params = jax.tree.map(
        lambda p, s: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s),
        init_params(cfg),
        shardings,
    )
    by_rows = NamedSharding(mesh, P(None, "data"))
    tokens = jax.ShapeDtypeStruct((4, 8, 17), jnp.int32, sharding=by_rows)  # 4 microbatches
    text = jax.jit(accumulate, out_shardings=shardings).lower(params, tokens).compile().as_text()
    entry = re.search(r"^ENTRY %?(\S+)", text, re.M).group(1)
    reductions = [r for r in book.hlo.collectives(text) if r.op == "all-reduce"]
    assert reductions and all(r.computation != entry for r in reductions)


@pytest.mark.slow
def test_every_layout_of_the_flag_resumes_to_the_same_losses(train, tmp_path):
    """train.py's --layout takes each of chapter 13's rules tables; run as one process here,
    on this test run's 8 devices. DP draws the parameters and saves step 1; each layout
    restores that checkpoint onto its own mesh and gives DP's loss at step 2 within bfloat16's
    precision, as the chapter's restart onto FSDP x TP did."""
    import shutil

    import numpy as np

    def run(layout, mesh, every):
        folder = tmp_path / layout.replace(" ", "")
        flags = ["--steps", "2", "--checkpoint-every", every, "--layout", layout]
        flags += ["--mesh", mesh, "--checkpoint-dir", folder / "c", "--log-dir", folder / "log"]
        train.main(train.parser.parse_args([str(f) for f in flags]))
        lines = (folder / "log" / "0-of-1.jsonl").read_text().splitlines()
        return {json.loads(line)["step"]: json.loads(line)["loss"] for line in lines}

    reference = run("DP", "8", 1)  # saves steps 1 and 2
    assert sorted(reference) == [1, 2]
    for layout, mesh in [("FSDP", "8"), ("TP", "8"), ("FSDP x TP", "4x2")]:
        folder = tmp_path / layout.replace(" ", "")
        shutil.copytree(tmp_path / "DP" / "c" / "step_1", folder / "c" / "step_1")
        resumed = run(layout, mesh, 8)
        assert sorted(resumed) == [2], layout  # from the checkpoint of step 1
        np.testing.assert_allclose(resumed[2], reference[2], rtol=2**-8, err_msg=layout)


def test_devices_of_several_slices_are_laid_out_by_id(train, tmp_path, monkeypatch, capsys):
    # jax.make_mesh refuses devices of several slices, as multi-node GPU jobs have (jax
    # 0.11 on); train.py then lays them out in the order of their ids, host by host.
    def refuse(*args, **kwargs):
        raise ValueError("`jax.make_mesh` does not support multi-slice topologies.")

    monkeypatch.setattr(train.jax, "make_mesh", refuse)
    args = ["--steps", "1", "--layout", "FSDP x TP", "--mesh", "4x2"]
    train.main(train.parser.parse_args([*args, "--checkpoint-dir", str(tmp_path / "c")]))
    out = capsys.readouterr().out
    assert "FSDP x TP on {'fsdp': 4, 'model': 2}" in out and "step 1 |" in out


def batch_script() -> str:
    """The 4-node batch script of chapter 19, from its markdown cell."""
    cells = json.loads(CHAPTER.read_text())["cells"]
    (script,) = re.findall(
        r"```bash\n(#!/bin/bash\n#SBATCH --nodes=4.*?)```",
        "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown"),
        re.S,
    )
    return script


SAVED = "preempted at step 8: written in 0.3 s, exiting\n"  # as train.py prints it


@pytest.mark.parametrize(
    "earlier, printed, at_limit, requeued, exit_code, restarts",
    [
        ("", "step 7\n" + SAVED, True, True, 0, None),  # saved at the time limit
        ("", "step 7\n" + SAVED, False, False, 0, None),  # saved earlier: preempted, or by hand
        ("", "step 8000 | loss 1.0\n", True, False, 0, None),  # finished: nothing to requeue
        (SAVED, "step 9000\n", True, False, 0, None),  # an earlier attempt's line
        ("", "step 7\n", False, True, 1, None),  # crashed: requeued
        ("", "step 7\n", False, True, 1, "2"),  # crashed a third time: requeued
        ("", "step 7\n", False, False, 1, "3"),  # a fourth: left failed
    ],
)
def test_the_batch_script_requeues_an_attempt_that_saved_at_its_limit_or_crashed(
    tmp_path, earlier, printed, at_limit, requeued, exit_code, restarts
):
    # srun prints the attempt's lines, then a megabyte more (other tasks' lines): a grep
    # that stops at its first match must not fail the pipeline it reads (set -o pipefail).
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text(
        "#!/bin/bash\nprintf '%s' \"$STAND_IN_PRINTS\"\nhead -c 1000000 /dev/zero | tr '\\0' x\n"
        "exit $STAND_IN_EXITS\n"
    )
    (bin_ / "scontrol").write_text('#!/bin/bash\necho "$@" >> scontrol_calls\n')
    for tool in ("srun", "scontrol"):
        (bin_ / tool).chmod(0o755)
    (tmp_path / "run-7.out").write_text(earlier)  # sbatch's --output, written before
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "STAND_IN_PRINTS": printed}
    env["STAND_IN_EXITS"] = str(exit_code)
    env["SLURM_RESTART_COUNT"] = "5"  # every requeue, preemptions too: not the crashes
    if restarts is not None:  # earlier attempts' crashes, as the script counts them
        (tmp_path / "run-7.crashes").write_text("1\n" * int(restarts))
    env.update(SLURM_JOB_NAME="run", SLURM_JOB_ID="7", SLURM_CPUS_PER_TASK="16")  # as sbatch sets
    script = tmp_path / "job.sh"
    text = batch_script()
    if at_limit:  # as if the attempt had run its whole allowance
        assert text.count("limit=$((24 * 3600))") == 1
        text = text.replace("limit=$((24 * 3600))", "limit=0")
    script.write_text(text)
    with open(tmp_path / "run-7.out", "a") as out:
        done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, stdout=out)
    assert done.returncode == exit_code
    calls = tmp_path / "scontrol_calls"
    assert (calls.read_text() == "requeue 7\n") if requeued else not calls.exists()


@pytest.mark.parametrize(
    "env, named",
    [
        ({"JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES"),
        ({"JAX_NUM_PROCESSES": "1"}, "JAX_PROCESS_ID"),  # set alone
        ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}, "JAX_PROCESS_ID"),  # past the count
        ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "JAX_COORDINATOR_ADDRESS"),
        *(
            (
                {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0", "JAX_COORDINATOR_ADDRESS": a},
                "JAX_COORDINATOR_ADDRESS",
            )
            for a in ("localhost", "localhost:abc", "[::1]", "localhost:70000", ":1234")
        ),
    ],
)
def test_launch_variables_set_wrong_by_hand_end_in_one_line(train_py, tmp_path, env, named):
    """JAX_NUM_PROCESSES is train.py's sign of book.multihost.launch; typed by hand and wrong, it
    gets a sentence naming the variable, not int's or initialize's traceback."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SLURM_"))}
    done = subprocess.run(
        [sys.executable, str(train_py), "--steps", "1", "--checkpoint-dir", "ckpt"],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    said = done.stderr.strip().splitlines()
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert said[-1].startswith(f"train.py: set {named}"), said[-1]
