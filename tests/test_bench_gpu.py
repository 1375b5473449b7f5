"""benchmarks/bench_gpu.py in its dry mode, and the stored GPU measurement the chapters read."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import book.trace
from book import measured, sizing

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_gpu.py"


def test_the_dry_run_measures_every_part_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, SCRIPT, "--dry", "--out", out, "--keep", tmp_path],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["dry"] and results["machine"]["jax"] and results["machine"]["date"]
    assert results["setup"]["mock"] and results["setup"]["devices"] == 8
    assert "8 mock CPU devices" in results["setup"]["printed"]
    rows = results["kernels"]["rows"]
    assert {r["kernel"] for r in rows} >= {"matmul", "x + y", "sum(x)"}
    for r in rows:
        assert r["best_s"] > 0 and r["median_s"] >= r["best_s"]
        if r["kernel"] == "matmul":  # XLA:CPU counts its products: the textbook's 2k³
            assert r["flops"] == 2 * r["shape"][0] ** 3
    train = results["train"]
    steps = int(train["flags"][train["flags"].index("--steps") + 1])
    assert len(train["losses"]) == steps and all(math.isfinite(x) for x in train["losses"])
    assert train["tokens_per_second"] > 0 and train["memory_bytes"]["peak_memory_in_bytes"] > 0
    assert train["profile"]["programs"] == ["jit_train_step"] and train["profile"]["ops"] > 0
    kept = book.trace.read(tmp_path / "gpu_trace.json.gz")
    assert kept.programs == ["jit_train_step"] and [s.number for s in kept.steps] == [steps - 1]
    assert (tmp_path / "gpu_step.hlo.gz").is_file()


BAD_FLAGS = [
    *(["--out", out] for out in ["no/gpu.json", "", ".", "/proc/gpu.json", "a" * 300]),
    *(["--keep", keep] for keep in ["no", "/proc", "/dev/null", "", " "]),
]


@pytest.mark.parametrize("flags", BAD_FLAGS)
def test_a_bad_flag_gets_one_sentence_before_any_part_runs(tmp_path, flags):
    done = subprocess.run(
        [sys.executable, SCRIPT, "--dry", *flags],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert last.startswith(f"bench_gpu.py: error: {'argument ' * (flags[0] == '--out')}")
    assert "cannot write" in last and not list(tmp_path.iterdir())


def test_the_stored_measurement_is_a_real_gpu_run_with_its_provenance():
    gpu = measured.load()
    assert gpu is not None and not gpu.data["dry"]
    assert gpu.data["kernels"]["platform"] == "gpu" and gpu.hardware.name == "H100"
    for part in ("kernels", "train", "setup"):
        assert "error" not in gpu.data[part], part
    for word in (gpu.device, gpu.data["machine"]["jax"], gpu.data["machine"]["date"]):
        assert word in gpu.provenance
    # Below the published peaks, as measurements must be; the largest bf16 product near it.
    assert all(0 < r["of_peak"] < 1 for r in gpu.matmuls() + gpu.streams())
    largest = max((r for r in gpu.matmuls() if r["dtype"] == "bfloat16"), key=lambda r: r["k"])
    assert largest["of_peak"] > 0.5
    step = gpu.step()
    assert 0 < step["mfu"] < 1
    # The stored FLOPs are book.sizing's for the stored model and flags.
    plan = sizing.plan(gpu.model(), global_batch=step["batch"], seq=step["seq"])
    assert plan.flops["model"] == step["model_flops"]
    assert sizing.param_count(gpu.model()) == step["parameters"]
    # On one GPU the one-device chapters fall back to 8 mock CPU devices, and say why.
    setup = gpu.data["setup"]
    assert setup["mock"] and "1 GPU device, fewer than 8" in setup["printed"]


def test_the_stored_gpu_trace_reads_as_kernels_of_one_device():
    profile = book.trace.read(measured.TRACE)
    assert profile.devices == [0] and profile.programs == ["jit_train_step"]
    (run,) = profile.runs("jit_train_step")  # told apart by the annotated step: no run ids
    (step,) = profile.steps
    assert all(step.start <= op.start and op.end <= step.end for op in run)
    kinds = {measured.kernel_kind(op.kernel) for op in run}
    assert kinds == {"matmul", "copy", "scatter", "other"}


def finished_run():
    return json.loads(measured.RESULTS.read_text())


@pytest.mark.parametrize(
    "given, words",
    [
        (42, "path must be a path"),
        ("", "path must be a path"),
        ("a\0b", "NUL character"),
        ("no-such.json", "There is no file"),
        (".", "cannot be read as JSON"),
        ("not json", "cannot be read as JSON"),
        ([], "holds no finished run"),
        ({"machine": {}, "kernels": {}, "train": {}}, "(peaks missing or failed)"),
        ({**finished_run(), "train": {"error": "out of memory"}}, "(train missing or failed)"),
        (
            {**finished_run(), "machine": {**finished_run()["machine"], "peaks": {"chip": None}}},
            "a device whose peaks book.sizing does not have",
        ),  # what a run on another GPU, or --dry, stores
        (
            {"machine": {"peaks": {"chip": "H100"}}, "kernels": {}, "train": {}},
            "names no device it ran on (kernels.device_kind is None)",
        ),
        (
            {**finished_run(), "train": {**finished_run()["train"], "median_step_s": 0}},
            "(ZeroDivisionError",
        ),
        ("/dev/zero", "(not a regular file)"),  # read forever, until memory runs out
        ("pipe", "(not a regular file)"),  # waits forever for a writer
        ("large", "(too large)"),
    ],
)
def test_a_file_that_is_no_finished_run_is_refused_in_one_sentence(tmp_path, given, words):
    if isinstance(given, (list, dict)):
        (tmp_path / "run.json").write_text(json.dumps(given))
        given = tmp_path / "run.json"
    elif given == "not json":
        (tmp_path / "run.json").write_bytes(b"\xff{")
        given = tmp_path / "run.json"
    elif given == "pipe":
        os.mkfifo(tmp_path / "run.json")
        given = tmp_path / "run.json"
    elif given == "large":
        with open(tmp_path / "run.json", "wb") as f:
            f.truncate(measured.MAX_BYTES + 1)
        given = tmp_path / "run.json"
    with pytest.raises(measured.MeasurementError) as caught:
        measured.load(tmp_path / given if given in (".", "no-such.json") else given)
    message = str(caught.value)
    assert words in message and "\n" not in message and message.endswith("."), message


def test_kernel_kind_takes_a_name_only():
    assert measured.kernel_kind("nvjet_sm90_tst_128x256") == "matmul"
    with pytest.raises(measured.MeasurementError, match="as text"):
        measured.kernel_kind(7)
