"""Measure the book against its speed budget and write BENCHMARKS.md.

Each chapter is executed in a fresh kernel, as the test run and the book build do, and its wall
seconds and the kernel's peak memory are recorded. Each form's pure function is timed on a series
of changes, one choice at a time as a reader makes them, after what showing the form computes.

Usage: python benchmarks/bench.py [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAPTER_BUDGET_S = 30.0
# Chapters that start processes of their own: chapter 11 under a Slurm cluster, chapter 19's
# four attempts at a training run.
OWN_BUDGETS_S = {"11_multi_controller": 40.0, "19_a_training_run": 45.0}
BOOK_BUDGET_S = 240.0
FORM_BUDGET_MS = 100.0


def run_one(path: Path) -> dict:
    """Execute one notebook in a fresh kernel; report wall seconds and the kernel's peak RSS."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    # The kernel was this process's child; its peak resident memory is in RUSAGE_CHILDREN.
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"seconds": seconds, "peak_mib": peak_kib / 1024}


def chapters() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def time_chapters() -> list[tuple[str, dict]]:
    rows = []
    for path in chapters():
        done = subprocess.run(
            [sys.executable, __file__, "--one", str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append((path.stem, json.loads(done.stdout.strip().splitlines()[-1])))
        print(f"{path.stem}: {rows[-1][1]['seconds']:.1f} s", file=sys.stderr)
    return rows


def _median_ms(render, warmup, choices) -> float:
    """Median milliseconds per call of ``render`` over ``choices``, after ``warmup()``."""
    warmup()
    times = []
    for args in choices:
        start = time.perf_counter()
        render(*args)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def form_cases():
    """Each form's pure function, what showing the form computes, and changes one at a time.

    Yields (name, render, warm-up, choices): ``warmup()`` does what showing the form does (its
    first rendering and, for forms with a static twin, every pre-rendered choice), and each
    choice is the arguments of one call.
    """
    from book import forms

    mesh_and_specs = [
        ("(8, 4)", "(2, 4)", "data, model", "P('data', None)"),
        ("(8, 4)", "(2, 4)", "data, model", "P('data', 'model')"),
        ("(8, 4)", "(4, 2)", "data, model", "P('data', 'model')"),
        ("(8, 4)", "(4, 2)", "data, model", "P(None, 'model')"),
        ("(8, 4)", "(2, 2, 2)", "pipe, data, model", "P(('pipe', 'data'), 'model')"),
        ("(8, 4)", "(8,)", "data", "P('data')"),
        ("(8, 4)", "(2, 4)", "data, model", "P('data', 'data')"),
        ("(16, 8)", "(2, 4)", "data, model", "P(('data', 'model'), None)"),
    ]
    yield (
        "sharding explorer (render_sharding)",
        forms.render_sharding,
        lambda: forms.render_sharding(*mesh_and_specs[0]),
        mesh_and_specs,
    )

    def collective(kind, mesh, axis, block="(8,)", tiled=False, perm="shift"):
        # The live form's call: its diagram included, options as keywords.
        return forms.render_collective(kind, mesh, axis, block_shape=block, tiled=tiled, perm=perm)

    def show_collective_form():
        forms.static_collective_explorer()
        collective("psum", "8", "data")

    yield (
        "collective explorer (render_collective)",
        collective,
        show_collective_form,
        [
            ("all_gather", "8", "data"),
            ("all_gather", "8", "data", "(8,)", True),
            ("psum_scatter", "8", "data", "(8,)", True),
            ("all_to_all", "8", "data", "(8,)", True),
            ("ppermute", "8", "data", "(8,)", False, "ring"),
            ("psum", "2x4", "model"),
            ("psum", "2x4", "data"),
            ("psum", "2x4", "data", "(4, 2)"),
            ("all_gather", "2x2x2", "pipe", "(4, 2)"),
        ],
    )
    # Showing the strategy form renders every strategy and mesh at the default sizes for its
    # static twin, so those steps are compiled before the reader's first change.
    changes = [
        ("DP", "8"),
        ("FSDP", "8"),
        ("TP", "8"),
        ("DP x TP", "4x2"),
        ("DP x TP", "2x4"),
        ("FSDP", "2"),
        ("TP", "4"),
        ("DP", "4"),
    ]
    yield (
        "strategy form (render_strategy): strategy or mesh",
        forms.render_strategy,
        forms.static_strategy_explorer,
        changes,
    )
    # The layout form of chapter 13: showing it pre-renders every rules table on its meshes,
    # compiling each step (the chapter hands its own steps over; here nothing is handed).
    yield (
        "layout form (render_transformer): rules table or mesh",
        forms.render_transformer,
        forms.static_transformer_explorer,
        [
            ("DP", "8"),
            ("FSDP x TP", "4x2"),
            ("FSDP x TP", "2x4"),
            ("DP x FSDP x TP", "2x2x2"),
            ("TP + SP", "8"),
            ("TP", "8"),
        ],
    )
    # The sizing form of chapter 18: arithmetic only, nothing compiled.
    yield (
        "sizing form (render_sizing): model, chip, layout or chips",
        forms.render_sizing,
        forms.static_sizing_explorer,
        [
            ("Llama 3 8B", "TPU v5p", "FSDP", "256"),
            ("Llama 3 70B", "TPU v5p", "FSDP", "256"),
            ("Llama 3 70B", "H100", "FSDP", "256"),
            ("Llama 3 70B", "H100", "FSDP x TP", "256"),
            ("Llama 3 70B", "H100", "FSDP x TP x PP", "1024"),
            ("Llama 3 70B", "H100", "FSDP x TP", "1024", "2048", "8192"),
        ],
    )


def machine(start_load) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import jax

    def load(averages):
        return "/".join(f"{x:.1f}" for x in averages)

    import book.slurm

    nodes = book.slurm.usable_nodes()
    cluster = f"a Slurm cluster of {len(nodes)} nodes" if nodes else "no Slurm cluster"
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), "
        f"{mem_gib:.0f} GiB memory; Python {platform.python_version()}, jax {jax.__version__}; "
        f"chapters on 8 mock CPU devices, {cluster}; load average (1/5/15 min) before the chapters "
        f"{load(start_load)}, before the forms {load(os.getloadavg())}"
    )


def report(chapter_rows, form_rows, start_load) -> str:
    total = sum(r["seconds"] for _, r in chapter_rows)
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (benchmarks/bench.py). Budgets: every chapter under "
        f"{CHAPTER_BUDGET_S:.0f} s ("
        + ", ".join(f"{stem[:2]}: {s:.0f} s" for stem, s in OWN_BUDGETS_S.items())
        + f"), the whole book under {BOOK_BUDGET_S:.0f} s, every form "
        f"answering a change in under {FORM_BUDGET_MS:.0f} ms.",
        "",
        f"Machine: {machine(start_load)}.",
        "",
        "## Chapters",
        "",
        "| chapter | wall seconds | peak kernel memory (MiB) | within budget |",
        "| --- | ---: | ---: | --- |",
    ]
    for stem, r in chapter_rows:
        ok = "yes" if r["seconds"] < OWN_BUDGETS_S.get(stem, CHAPTER_BUDGET_S) else "**no**"
        lines.append(f"| {stem} | {r['seconds']:.1f} | {r['peak_mib']:.0f} | {ok} |")
    ok = "yes" if total < BOOK_BUDGET_S else "**no**"
    lines += [f"| **whole book** | **{total:.1f}** | | {ok} |", "", "## Forms", ""]
    lines += ["| form | median ms per change | within budget |", "| --- | ---: | --- |"]
    for name, ms in form_rows:
        ok = "yes" if ms < FORM_BUDGET_MS else "**no**"
        lines.append(f"| {name} | {ms:.1f} | {ok} |")
    lines += [
        "",
        "Each form is timed after what showing it computes: its first rendering and the choices "
        "its static twin pre-renders. A change that needs a program not compiled yet pays for "
        "the compile; the online book's forms are pre-rendered and answer in the browser.",
    ]
    return "\n".join(lines + gpu_section()) + "\n"


def gpu_section() -> list[str]:
    """The stored one-GPU measurement (make bench-gpu), as chapters 12, 17 and 18 show it."""
    from book import measured

    gpu = measured.load()
    if gpu is None:
        return []
    lines = ["", "## One GPU (stored, from `make bench-gpu`)", "", gpu.provenance, ""]
    lines += ["| k x k x k product | TFLOP/s (fastest of 20) | of the dense peak |"]
    lines += ["| --- | ---: | ---: |"]
    for r in gpu.matmuls():
        kind = f"{r['dtype']}, precision {r['precision']}"
        peak = f"{r['of_peak']:.0%} of {r['peak_name']}'s {r['peak_tflops']:g}"
        lines.append(f"| {r['k']:,}, {kind} | {r['tflops']:.0f} | {peak} |")
    lines += [
        "",
        "| elementwise kernel | elements | GB/s | of HBM's |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in gpu.streams():
        name = f"{r['kernel']}, {r['dtype']}"
        lines.append(f"| {name} | {r['elements']:,} | {r['gbps']:,.0f} | {r['of_peak']:.0%} |")
    step = gpu.step()
    lines += [
        "",
        f"Chapter 19's train.py at {step['parameters'] / 1e9:.2f}B parameters, "
        f"{step['batch']} sequences of {step['seq']} tokens in {step['microbatches']} "
        f"microbatches: {step['seconds'] * 1e3:.0f} ms a step, "
        f"{step['tokens_per_second']:,.0f} tokens/s, MFU {step['mfu']:.1%}, XLA's planned "
        f"peak memory {step['peak_memory_bytes'] / 1e9:.1f} GB.",
    ]
    return lines


def _notebook(text: str) -> Path:
    """A notebook that exists and reads as one, checked before a kernel is started for it."""
    import nbformat

    try:
        found = Path(text).is_file() and text.endswith(".ipynb")
        found = found and bool(nbformat.read(text, as_version=4))
    except (OSError, ValueError, nbformat.ValidationError):  # too long, NUL, not a notebook
        found = False
    if not found:
        raise argparse.ArgumentTypeError(f"no notebook can be read from {text[:120]!r}")
    return Path(text)


def _report_file(text: str) -> Path:
    """Where the report goes: checked before the minutes of timing, not after them."""
    path = Path(text)
    try:  # a file made in its folder and removed at once: os.access says yes to /proc
        with tempfile.TemporaryFile(dir=path.parent):
            usable = path.is_file() or not path.exists()  # not a folder, a pipe, a terminal
        # A link to nowhere (or to itself) does not exist yet cannot be made; a file that
        # exists must be one this user can replace.
        usable = usable and not (path.is_symlink() and not path.exists())
        usable = usable and (not path.exists() or os.access(path, os.W_OK))
    except (OSError, ValueError):  # no such folder, a name too long, or one holding NUL
        usable = False
    if not usable:
        raise argparse.ArgumentTypeError(
            f"cannot write {text[:120]!r}: name a file in a folder that exists and is writable"
        )
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", type=_notebook, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=_report_file, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one)))
        return
    start_load = os.getloadavg()
    chapter_rows = time_chapters()
    import book.devices

    book.devices.setup(8)
    form_rows = [(name, _median_ms(*case)) for name, *case in form_cases()]
    text = report(chapter_rows, form_rows, start_load)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
