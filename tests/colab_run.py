"""Execute every chapter the way Colab or Kaggle runs one: alone, in an empty folder, with the
`book` wheel installed ``--no-deps`` beside a jax the book did not choose.

The environment is a venv holding only what pyproject.toml declares (jax at the version asked
for, the oldest supported by default) plus the kernel that runs notebooks, so a chapter that
leans on anything requirements.txt pins and pyproject does not, or on a jax newer than the
floor, fails here. Used by ``make test-floor`` (and ``make test-colab`` for the pinned jax).

    python tests/colab_run.py --venv .venv-floor --jax floor --ipywidgets 7.7.1
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ("nbclient", "ipykernel")  # what a notebook runtime has and pyproject does not
EXECUTE = """
import sys, nbformat, nbclient
nb = nbformat.read(sys.argv[1], as_version=4)
nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
"""


# Chapters that need a jax newer than the floor, with why: skipped, and said so, on older ones.
NEEDS = {
    "19_a_training_run.ipynb": (
        (0, 11),
        "its restart keeps AdamW's state in pinned_host memory, which jax 0.10's partitioner "
        "refuses (a RET_CHECK on the offloading custom call)",
    ),
}


def release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def jax_version(which: str) -> str:
    """'floor' is pyproject's lower bound, 'pinned' requirements.txt's pin, else as given."""
    if which == "floor":
        dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        (version,) = [
            d.split(">=")[1] for d in dependencies["dependencies"] if d.startswith("jax>=")
        ]
        return version
    if which == "pinned":
        (version,) = re.findall(r"^jax==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M)
        return version
    return which


def requirements(jax: str, ipywidgets: str | None) -> list[str]:
    """pyproject's dependencies with jax (and ipywidgets, if given) at exact versions."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = [f"jax=={jax}", f"jaxlib=={jax}"]
    for dependency in declared:
        name = re.split(r"[<>=!~ ]", dependency, maxsplit=1)[0]
        if name == "jax" or (name == "ipywidgets" and ipywidgets):
            continue
        wanted.append(dependency)
    if ipywidgets:
        wanted.append(f"ipywidgets=={ipywidgets}")
    return wanted + list(RUNNER)


def prepare(venv: Path, wanted: list[str]) -> Path:
    """The venv's python, with exactly ``wanted`` installed (reused while they stay the same)."""
    venv = venv.resolve()  # chapters run in other folders
    python = venv / "bin" / "python"
    stamp = venv / ".colab-run"
    if not (python.exists() and stamp.exists() and stamp.read_text() == json.dumps(wanted)):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *wanted], check=True)
        stamp.write_text(json.dumps(wanted))
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
            + ["-w", folder, str(ROOT)],
            check=True,
        )
        (wheel,) = Path(folder).glob("*.whl")
        install = [python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall"]
        subprocess.run([*install, str(wheel)], check=True)
    return python


def run_alone(python: Path, chapter: Path) -> tuple[str, float, str]:
    """Execute one chapter as the only file of an empty folder; (name, seconds, error or '')."""
    with tempfile.TemporaryDirectory(prefix="colab-run-") as folder:
        copy = Path(folder) / chapter.name
        shutil.copy(chapter, copy)
        start = time.perf_counter()
        done = subprocess.run(
            [python, "-c", EXECUTE, str(copy)],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=900,
        )
        seconds = time.perf_counter() - start
    error = "" if done.returncode == 0 else (done.stdout + done.stderr)[-1500:]
    return chapter.name, seconds, error


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv-floor")
    parser.add_argument("--jax", default="floor", help="floor, pinned, or a version")
    parser.add_argument("--ipywidgets", default=None, help="a version in place of pyproject's")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("chapters", nargs="*", type=Path)
    args = parser.parse_args(argv)

    jax = jax_version(args.jax)
    python = prepare(args.venv, requirements(jax, args.ipywidgets))
    shown = subprocess.run(
        [python, "-c", "import jax, ipywidgets; print(jax.__version__, ipywidgets.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    print(f"Colab-like run: jax {shown[0]}, ipywidgets {shown[1]}, each chapter alone")
    chapters = args.chapters or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for chapter in [c for c in chapters if c.name in NEEDS]:
        oldest, why = NEEDS[chapter.name]
        if release(shown[0]) < oldest:
            print(f"skipped {chapter.name}: it needs jax {'.'.join(map(str, oldest))}; {why}")
            chapters.remove(chapter)
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda chapter: run_alone(python, chapter), chapters))
    failed = 0
    for name, seconds, error in results:
        print(f"{'FAILED' if error else 'ok':6} {name:40} {seconds:6.1f} s")
        if error:
            failed += 1
            print("       " + error.replace("\n", "\n       "))
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
