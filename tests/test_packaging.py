"""Colab and Kaggle install the `book` package from the repository: every module must ship."""

import subprocess
import sys
import zipfile

from nbconventions import ROOT


def test_the_wheel_holds_every_module(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "book").rglob("*.py")}
    assert modules and modules <= names, sorted(modules - names)
    assert "book/book.css" in names, "the stylesheet every output embeds must ship too"
    # Chapters 12, 17 and 18 read the stored GPU measurement in Colab too.
    assert {"book/measurements/gpu.json", "book/measurements/gpu_trace.json.gz"} <= names
