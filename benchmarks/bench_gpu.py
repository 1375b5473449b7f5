"""Measure on one accelerator what the book otherwise quotes, and write it as one JSON file.

Four parts, each in a process of its own so that one failing or running out of memory costs
only its own entry (JAX also takes most of an accelerator's memory for the process that
starts it first):

- ``setup``: what the chapters' setup cell says on this runtime and which devices it gives;
- ``kernels``: chapter 12's matrix products and elementwise kernels, bfloat16 and float32 at
  several sizes, their FLOPs and bytes from XLA's cost analysis, timed with book.timing;
- ``train``: chapter 19's train.py, unchanged but for a larger chapter 13 model, for a few
  steps on this machine's devices: tokens per second, MFU against book.sizing's peak, the
  memory XLA planned, and the last step's profile read with book.trace;
- the machine: device, driver, jax version, date.

Usage: python benchmarks/bench_gpu.py [--dry] [--out FILE] [--keep FOLDER]

On an accelerator, ``--keep book/measurements`` also keeps the profiled step's trace there
(``gpu_trace.json.gz``, which chapter 17 reads) and its compiled program (``gpu_step.hlo.gz``).

``--dry`` runs the same code on the CPU at tiny sizes (make test does, so the script is known
to work before an accelerator is at hand). Without it the script needs an accelerator.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import gzip
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the book package of this clone

from benchmarks.bench import _report_file  # noqa: E402 - a file checked before the minutes

PART_TIMEOUT_S = 240
# Where the book reads the measurement (book.measured), with the profiled step's trace beside it.
STORED = ROOT / "book" / "measurements" / "gpu.json"

# Chapter 13's model at a size where an accelerator is busy (about half a billion
# parameters), and a tiny one for the dry run. The learning rate stays chapter 19's, set for
# its tiny model: at this size the loss climbs. The run measures speed, not learning.
MODEL = {
    "full": dict(
        vocab=32768, d_model=2048, n_heads=16, n_kv_heads=8, d_head=128, d_mlp=8192, n_layers=8
    ),
    "dry": {},  # chapter 13's defaults
}
TRAIN_FLAGS = {  # train.py's flags; --checkpoint-every = --steps: one save, at the end
    "full": ["--steps", "12", "--batch", "32", "--microbatches", "4", "--seq", "1024"],
    "dry": ["--steps", "3", "--batch", "8", "--microbatches", "2", "--seq", "16"],
}
LIBRARIES = ("jax-cuda", "jax-rocm", "libtpu", "nvidia-cublas", "nvidia-cudnn", "nvidia-nccl")
MATMUL_SIZES = {"full": [1024, 2048, 4096, 8192, 16384], "dry": [64]}
ELEMENTS = {"full": [2**20, 2**24, 2**28], "dry": [2**12]}


def chip(device_kind: str):
    """book.sizing's entry for a GPU, by the name JAX gives it, or None.

    Only the SXM H100 and H200, whose float32 peaks book.measured also knows; on another
    device the results are stored without peaks, for a table entry to be added first.
    """
    from book import measured, sizing

    return sizing.HARDWARE.get(measured.DEVICE_CHIPS.get(device_kind.lower()))


def peaks(device_kind: str) -> dict:
    hardware = chip(device_kind)
    if hardware is None:
        return {"chip": None, "peak_bf16_flops": None, "hbm_bandwidth": None, "source": None}
    return {
        "chip": hardware.name,
        "peak_bf16_flops": hardware.peak_flops,
        "hbm_bandwidth": hardware.hbm_bandwidth,
        "source": hardware.source,
    }


def part_setup(size: str) -> dict:
    """What the chapters' setup cell prints here, and the devices it leaves JAX."""
    import contextlib
    import io

    import book.devices

    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        plan = book.devices.setup(8)
    import jax

    devices = jax.devices()
    return {
        "printed": said.getvalue().strip(),
        "platform": devices[0].platform,
        "devices": len(devices),
        "mock": plan.mock,
    }


def counted_or_none(counted: dict, key: str):
    value = counted.get(key)
    return value if value is not None and value >= 0 else None


def part_kernels(size: str) -> dict:
    """Chapter 12's kernels: FLOPs and bytes counted by XLA, seconds by book.timing."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from book import timing

    rng = np.random.default_rng(0)
    rows = []
    device = jax.devices()[0]

    def run(kernel, dtype, shape, fn, *args):
        compiled = jax.jit(fn).lower(*args).compile()
        counted = compiled.cost_analysis()
        took = timing.measure(compiled, *args, warmup=3, runs=20)
        rows.append(
            {
                "kernel": kernel,
                "dtype": dtype,
                "shape": shape,
                # XLA reports -1 for what it did not count (a cuBLAS call, on GPUs): None.
                "flops": counted_or_none(counted, "flops"),
                "bytes": counted_or_none(counted, "bytes accessed"),
                "median_s": took.median,
                "best_s": took.best,
            }
        )

    highest = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)
    for name in ("bfloat16", "float32"):
        dtype = jnp.dtype(name)
        for k in MATMUL_SIZES[size]:
            a = jnp.asarray(rng.standard_normal((k, k)), dtype)
            b = jnp.asarray(rng.standard_normal((k, k)), dtype)
            run("matmul", name, [k, k, k], jnp.matmul, a, b)
            if name == "float32":  # default precision, then every bit of float32
                run("matmul, precision HIGHEST", name, [k, k, k], highest, a, b)
            del a, b
        for n in ELEMENTS[size]:
            v = jnp.asarray(rng.standard_normal(n), dtype)
            w = jnp.asarray(rng.standard_normal(n), dtype)
            run("x + y", name, [n], jnp.add, v, w)
            run("copy: v + 1", name, [n], lambda v: v + 1, v)
            run("sum(x)", name, [n], jnp.sum, v)
            del v, w
    return {"device_kind": device.device_kind, "platform": device.platform, "rows": rows}


def train_module(path: Path):
    """Chapter 19's train.py, written from the chapter's own cell and imported."""
    import importlib.util

    chapter = json.loads((ROOT / "notebooks" / "19_a_training_run.ipynb").read_text())
    magic = "%%writefile train.py\n"
    (cell,) = [
        "".join(c["source"]) for c in chapter["cells"]
        if c["cell_type"] == "code" and "".join(c["source"]).startswith(magic)
    ]  # fmt: skip
    path.write_text(cell[len(magic) :])
    spec = importlib.util.spec_from_file_location("train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def part_train(size: str) -> dict:
    """Chapter 19's train.py for a few steps, on a larger chapter 13 model."""
    import book.trace
    from book import hlo, sizing
    from book.lessons import transformer
    from book.lessons.planning import small_model

    shm = Path("/dev/shm")  # memory: the checkpoint's seconds are not what is measured
    roomy = shm.is_dir() and shutil.disk_usage(shm).free > 20e9
    scratch = Path(tempfile.mkdtemp(dir=shm if roomy else None))
    try:
        train = train_module(scratch / "train.py")
        cfg = transformer.Config(**MODEL[size])
        train.Config = lambda: cfg  # the one change to the chapter's program
        flags = TRAIN_FLAGS[size]
        steps = int(flags[flags.index("--steps") + 1])
        flags = [
            *flags,
            *["--checkpoint-dir", str(scratch / "ckpt"), "--checkpoint-every", str(steps)],
            *["--log-dir", str(scratch / "log"), "--profile", str(scratch / "profile")],
            *["--dump", str(scratch / "dump")],
        ]
        args = train.parser.parse_args(flags)
        train.main(args)
        (log,) = (scratch / "log").iterdir()
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        memory = json.loads((scratch / "dump" / "memory.json").read_text())
        step_hlo = (scratch / "dump" / "step.hlo").read_text()
        trace_path = book.trace.trace_file(scratch / "profile")
        profile = book.trace.read(scratch / "profile")
        with gzip.open(trace_path, "rt") as f:
            events = json.load(f)["traceEvents"]
        if os.environ.get("BENCH_GPU_KEEP"):  # the raw trace and program, for a closer look
            keep = Path(os.environ["BENCH_GPU_KEEP"])
            shutil.copyfile(trace_path, keep / "gpu_trace.json.gz")
            with gzip.open(keep / "gpu_step.hlo.gz", "wt") as f:
                f.write(step_hlo)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    model = small_model(cfg)  # as book.sizing counts it
    model_flops = sizing.plan(model, global_batch=args.batch, seq=args.seq).flops["model"]
    # The first steps wait longest; the last one ran under the profiler.
    steady = [line["seconds"] for line in lines[2:-1]] or [line["seconds"] for line in lines]
    seconds = statistics.median(steady)
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            names.setdefault(e["name"], set()).add(str(e.get("args", {}).get("name")))
    (run,) = profile.runs(profile.programs[0]) if profile.programs else [()]
    kernels = {}  # on a GPU, each event is a kernel, named by itself
    for op in profile.ops:
        count, micros = kernels.get(op.kernel or op.name, (0, 0.0))
        kernels[op.kernel or op.name] = (count + 1, micros + op.duration)
    asynchronous = [i.op for i in hlo.instructions(step_hlo) if i.op.endswith(("-start", "-done"))]
    return {
        "model": dataclasses.asdict(cfg),
        "parameters": sizing.param_count(model),
        "flags": flags[: flags.index("--checkpoint-dir")],
        "losses": [line["loss"] for line in lines],
        "step_seconds": [line["seconds"] for line in lines],
        "median_step_s": seconds,
        "tokens_per_step": args.batch * args.seq,
        "tokens_per_second": args.batch * args.seq / seconds,
        "model_flops_per_step": model_flops,
        "memory_bytes": memory,
        "async_instructions": len(asynchronous),
        "profile": {
            "devices": profile.devices,
            "programs": profile.programs,
            "ops": len(profile.ops),
            "busy_us": sum(op.duration for op in run),
            "first_to_last_us": max(op.end for op in run) - min(op.start for op in run)
            if run
            else None,
            "steps": [[s.number, s.duration] for s in profile.steps],
            "kernels": len(kernels),
            "longest_kernels": sorted(kernels.items(), key=lambda kv: -kv[1][1])[:30],
            "process_names": sorted(names.get("process_name", ())),
            "thread_names": sorted(names.get("thread_name", ()))[:40],
            "events": len(events),
        },
    }


PARTS = {"kernels": part_kernels, "train": part_train, "setup": part_setup}


def run_part(name: str, size: str, keep: Path | None) -> dict:
    """One part in a fresh process: its JSON, or the end of what it wrote to stderr."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    if size == "dry":
        env["JAX_PLATFORMS"] = "cpu"
    if keep is not None:
        env["BENCH_GPU_KEEP"] = str(keep)
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--part", name, *(["--dry"] if size == "dry" else [])],
            capture_output=True, text=True, timeout=PART_TIMEOUT_S, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {PART_TIMEOUT_S} s"}
    sys.stderr.write(done.stderr[-4000:])
    if done.returncode:
        return {"error": done.stderr[-2000:] or f"exited with status {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine() -> dict:
    """What the numbers were measured on: device, driver, versions, date."""
    smi = shutil.which("nvidia-smi")
    driver = None
    if smi:
        query = [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        driver = subprocess.run(query, capture_output=True, text=True).stdout.strip() or None
    # The accelerator's side of jax and the libraries it calls, as installed.
    plugins = {
        d.metadata["Name"]: d.version
        for d in importlib.metadata.distributions()
        if d.metadata["Name"] and d.metadata["Name"].lower().replace("_", "-").startswith(LIBRARIES)
    }
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "jax": importlib.metadata.version("jax"),
        "jaxlib": importlib.metadata.version("jaxlib"),
        "libraries": dict(sorted(plugins.items())),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "nvidia_smi": driver,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="CPU, tiny sizes: a test run")
    out_help = f"default: {STORED} (--dry: a temporary file)"
    parser.add_argument("--out", type=_report_file, help=out_help)
    parser.add_argument("--keep", help="a folder for the step's trace and HLO")
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    size = "dry" if args.dry else "full"
    if args.out is None:  # a dry run never replaces the stored measurement
        args.out = Path(tempfile.gettempdir(), "bench_gpu_dry.json") if args.dry else STORED
    if args.part:  # a child: one part, its JSON on the last line of stdout
        print(json.dumps(PARTS[args.part](size)))
        return 0
    try:  # the trace and HLO are written minutes from now: the folder is tried first
        if args.keep is not None and not args.keep.strip():
            raise ValueError("an empty name is no folder")
        with tempfile.TemporaryFile(dir=args.keep or "."):
            pass
    except (OSError, ValueError):
        parser.error(f"--keep: cannot write in {args.keep!r}; name a folder that exists")
    results = {"machine": machine(), "dry": args.dry}
    for name in PARTS:
        results[name] = run_part(name, size, args.keep and Path(args.keep))
        print(f"{name}: {'failed' if 'error' in results[name] else 'done'}", file=sys.stderr)
        kind = results.get("kernels", {}).get("device_kind")
        results["machine"]["peaks"] = peaks(kind) if kind else None
        args.out.write_text(json.dumps(results, indent=1) + "\n")  # after each part
    failed = [name for name in PARTS if "error" in results[name]]
    print(f"wrote {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
