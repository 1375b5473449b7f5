"""Shared test set-up: 8 mock CPU devices, and one build of the book per test process."""

import subprocess
import sys
from pathlib import Path

import pytest

import book.devices

ROOT = Path(__file__).resolve().parent.parent

book.devices.setup(8)


@pytest.fixture(scope="session")
def built_book():
    """Build the book into _build/html (as `make book` does) with warnings as errors."""
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    done = subprocess.run(
        [str(jupyter_book), "build", str(ROOT), "--warningiserror"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return ROOT / "_build" / "html"
