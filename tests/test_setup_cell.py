"""The chapters' setup cell does the right thing in a clone, where the package is installed,
and in a fresh Colab or Kaggle runtime, without the network except in the last case."""

import importlib.metadata
import json
import subprocess
import sys

import pytest

from nbconventions import ROOT

CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def setup_cell(path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "".join(next(c for c in cells if c["cell_type"] == "code")["source"])


def install_part() -> str:
    """What the setup cell does before it imports the package."""
    return setup_cell(CHAPTERS[0]).split("import book.devices")[0]


def test_every_chapter_has_the_same_setup_cell():
    assert len({setup_cell(path) for path in CHAPTERS}) == 1


@pytest.fixture
def runtime(monkeypatch):
    """Run the install part as a kernel would, recording pip calls instead of making them."""
    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(sys, "path", list(sys.path))

    def run(folder):
        monkeypatch.chdir(folder)
        exec(install_part(), {"__name__": "__main__"})
        return calls

    return run


def test_in_a_clone_it_uses_the_clone_and_no_network(runtime):
    calls = runtime(ROOT / "notebooks")
    assert calls == [] and sys.path[0] == str(ROOT)


def test_where_installed_it_does_nothing_even_beside_a_folder_named_book(runtime, tmp_path):
    (tmp_path / "book").mkdir()
    before = list(sys.path)
    assert runtime(tmp_path) == [] and sys.path == before


def test_in_a_fresh_runtime_it_installs_from_the_repository_keeping_jax(
    runtime, tmp_path, monkeypatch
):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    (command,) = runtime(tmp_path)
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    assert "--no-deps" in command
    assert command[-1] == "git+https://github.com/jax-sharding-book/jax-sharding-book@main"
    assert not any("jax" in part and "jax-sharding-book" not in part for part in command)
