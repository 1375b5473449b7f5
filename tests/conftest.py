"""Shared test set-up: 8 mock CPU devices, each chapter executed once, one build of the book.

A test run executes every chapter once as written (``chapter_run``, shared by the xdist
workers), and the book is built from those executed notebooks with execution off
(``built_book``), so no chapter runs a third time. The tests that read the built book share the
xdist group "book", and so one worker and one build.
"""

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
import yaml
from filelock import FileLock
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

import book.devices

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CELL_TIMEOUT = 300  # seconds for one cell, as the book build allows
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours of IPython's tracebacks
# The pages with a form; test_book_build.py checks that no other page has one.
FORM_PAGES = (
    "02_sharded_arrays",
    "05_shard_map_and_collectives",
    "09_tensor_parallelism",
    "13_transformer_3d",
    "18_planning_a_real_run",
)

book.devices.setup(8)


def chapters() -> list[str]:
    """The stems of the numbered chapters in notebooks/, in reading order."""
    return sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def pages() -> list[str]:
    """Every page of the book, in the order of _toc.yml: a chapter has a page once listed there."""
    toc = (ROOT / "_toc.yml").read_text()
    files = re.findall(r"^\s*(?:root|- file):\s*notebooks/(\S+)", toc, re.M)
    assert files, "no pages in _toc.yml"
    return files


@dataclass(frozen=True)
class ChapterRun:
    """One chapter executed as written: the notebook with its outputs, and why it stopped early."""

    stem: str
    path: Path  # the executed notebook, kept for the book build and for people to read
    error: str | None  # None when every cell ran


@pytest.fixture(scope="session")
def chapter_run(tmp_path_factory, worker_id):
    """``chapter_run(stem)`` executes a chapter once per test run, in an empty folder of its own.

    Chapters write files (chapter 11 writes the scripts it launches), so each one runs where
    nothing else does. The runs are shared by the xdist workers of one test run through a
    folder and a lock per chapter: whichever worker asks first executes the chapter, the other
    waits for it and reads the result, so the runs spread over both workers and none repeats.
    A chapter that fails keeps the outputs up to and including the error, so its page shows
    what went wrong; the error is kept for the chapter's own test to report.
    """
    own = tmp_path_factory.getbasetemp()
    executed = (own if worker_id == "master" else own.parent) / "executed"
    executed.mkdir(exist_ok=True)

    def run(stem: str) -> ChapterRun:
        path, failure = executed / f"{stem}.ipynb", executed / f"{stem}.error"
        with FileLock(executed / f"{stem}.lock"):
            if not path.exists():
                nb = nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)
                folder = tmp_path_factory.mktemp(stem)
                client = NotebookClient(
                    nb, timeout=CELL_TIMEOUT, resources={"metadata": {"path": str(folder)}}
                )
                try:
                    client.execute()
                except (CellExecutionError, CellTimeoutError, DeadKernelError) as err:
                    failure.write_text(ANSI.sub("", f"{type(err).__name__}: {err}"))
                nbformat.write(nb, path)  # last: its presence says the run is complete
        return ChapterRun(stem, path, failure.read_text() if failure.exists() else None)

    return run


def stage_book(folder: Path, executed: list[Path]) -> None:
    """Copy the book's sources into ``folder``, with executed chapters and execution off."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"
    (folder / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.copy(ROOT / "_toc.yml", folder)
    for name in ("_static", "_ext"):
        shutil.copytree(ROOT / name, folder / name)
    (folder / "notebooks").mkdir()
    for path in [*NOTEBOOKS.glob("*.md"), *executed]:
        shutil.copy(path, folder / "notebooks")


@pytest.fixture(scope="session")
def built_book(chapter_run, tmp_path_factory):
    """The book built from this run's executed chapters, with warnings as errors: its HTML folder.

    A chapter that failed is still built (its page shows the error), so the other pages are
    checked all the same; the chapter's own test reports the failure. The landing page's map
    of the chapters is a Graphviz drawing, so without ``dot`` the book cannot build.
    """
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed, and the landing page's chapter map needs it")
    source = tmp_path_factory.mktemp("book")
    # Last chapter first: test_chapters.py asks from the first, so two workers seldom wait.
    executed = [chapter_run(stem).path for stem in reversed(chapters())]
    stage_book(source, executed)
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    done = subprocess.run(
        [str(jupyter_book), "build", str(source), "--warningiserror"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        pytest.fail("the book build failed:\n" + done.stdout[-3000:] + done.stderr[-3000:])
    return source / "_build" / "html"


# The rendered book in Debian's Chromium, shared by the browser tests of pages and of math.
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
if CHROMIUM is None and os.environ.get("CI"):
    raise RuntimeError("CI needs Chromium for the browser tests: apt-get install chromium")
SHOTS = ROOT / "_build" / "screenshots" if os.environ.get("BOOK_SCREENSHOTS") else None
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="install Debian's chromium")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(built_book):
    handler = functools.partial(QuietHandler, directory=str(built_book))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


def save(target, name, **options):
    """Save a screenshot of a page or a form, when BOOK_SCREENSHOTS asks for them."""
    if SHOTS is not None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        target.screenshot(path=str(SHOTS / name), **options)
