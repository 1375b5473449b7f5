"""Shared test set-up: 8 mock CPU devices, each chapter executed once by nbmake, one book build.

``make test`` collects every chapter as an nbmake item beside these tests (``pytest --nbmake
notebooks tests``). Each chapter runs on a copy in a folder of its own (``NotebookCopies``), and
the book is built from those executed copies with execution off (``built_book``), so no chapter
runs a third time. The tests that read the built book share the xdist group "book", and so one
worker and one build.
"""

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
import yaml
from nbconvert.preprocessors import CoalesceStreamsPreprocessor
from nbmake.pytest_items import NotebookItem

import book.devices

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
WAIT = 1800  # seconds to wait for a chapter's nbmake item, as long as the book build may take
# The pages with a form; test_book_build.py checks that no other page has one.
FORM_PAGES = (
    "02_sharded_arrays",
    "05_shard_map_and_collectives",
    "09_tensor_parallelism",
    "13_transformer_3d",
    "18_planning_a_real_run",
    "20_serving",
)

# The tests compile hundreds of small programs only to read them or run a few steps, where
# LLVM's optimization passes add nothing but time; the chapters' own kernels start without
# this flag (NotebookCopies), as a reader's do.
READERS_XLA_FLAGS = os.environ.get("XLA_FLAGS")
os.environ["XLA_FLAGS"] = f"{READERS_XLA_FLAGS or ''} --xla_backend_optimization_level=0".strip()
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


class NotebookCopies:
    """Runs each notebook nbmake collects on a copy in a folder of its own, and keeps it executed.

    nbmake runs a notebook in the folder that holds it, and chapters write files there (chapter
    11 the scripts it launches), so each item is pointed at a copy in ``executed/<stem>/`` of the
    run's temporary folder, which both xdist workers share; nbmake's ``--overwrite`` then writes
    the executed copy, outputs and any error included, over that copy, never over notebooks/.
    A marker written after the item says the copy is final, for the book build and the exercise
    tests, which may run on the other worker. A plugin rather than hooks of this conftest: pytest
    calls a conftest's test-running hooks only for the items below its folder.
    """

    def __init__(self, config):
        self.config = config
        self.sources = {}  # stem: the committed notebook, for the items of this run

    @functools.cached_property
    def folder(self) -> Path:
        base = self.config._tmp_path_factory.getbasetemp()
        # An xdist worker's temporary folder lies inside the run's, which the workers share.
        shared = base.parent if hasattr(self.config, "workerinput") else base
        return shared / "executed"

    def copy(self, stem: str) -> Path:
        return self.folder / stem / f"{stem}.ipynb"

    def done(self, stem: str) -> Path:
        return self.folder / f"{stem}.done"

    @pytest.hookimpl(trylast=True)  # after -k and --deselect: only the items that will run
    def pytest_collection_modifyitems(self, config, items):
        notebooks = [item for item in items if isinstance(item, NotebookItem)]
        for item in notebooks:
            self.sources[Path(item.filename).stem] = Path(item.filename)
            config.option.overwrite = True  # safe: every notebook item runs on a copy
        # The notebooks first, the last chapter first: with xdist's --no-loadscope-reorder both
        # workers execute chapters before one of them builds the book, and the chapter it may
        # wait for on the other worker is one of the first, the shortest.
        # Before them, the few tests marked early: they start what takes long to end (a Slurm
        # job that must run out its time limit) and leave its ending to a later test.
        early = [item for item in items if item.get_closest_marker("early")]
        rest = [item for item in items if item not in notebooks and item not in early]
        items[:] = early + notebooks[::-1] + rest

    def pytest_runtest_setup(self, item):
        if isinstance(item, NotebookItem):
            stem = Path(item.filename).stem
            self.done(stem).unlink(missing_ok=True)
            self.copy(stem).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.sources[stem], self.copy(stem))
            item.filename = str(self.copy(stem))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        if not isinstance(item, NotebookItem):
            return (yield)
        quick = os.environ.pop("XLA_FLAGS")  # the kernel starts with the reader's flags
        if READERS_XLA_FLAGS is not None:
            os.environ["XLA_FLAGS"] = READERS_XLA_FLAGS
        try:
            return (yield)
        finally:
            os.environ["XLA_FLAGS"] = quick

    def pytest_runtest_teardown(self, item):
        if isinstance(item, NotebookItem):
            self.done(Path(item.filename).stem).touch()


def pytest_configure(config):
    config.pluginmanager.register(NotebookCopies(config), "notebook-copies")


@pytest.fixture(scope="session")
def run_folder(pytestconfig) -> Path:
    """A folder of this run that every xdist worker shares: the run's temporary folder."""
    return pytestconfig.pluginmanager.get_plugin("notebook-copies").folder.parent


@pytest.fixture(scope="session")
def executed(pytestconfig):
    """``executed(stem)``: the chapter as its nbmake item executed it in this run, once finished.

    The item may run on the other xdist worker, so this waits for its marker. A chapter that
    failed keeps its outputs up to and including the error, so its page shows what went wrong;
    its own item reports the failure. Without the chapter's item in the run (``pytest tests``
    alone) there is nothing to read, and the test is skipped with the command that executes it.
    """
    copies = pytestconfig.pluginmanager.get_plugin("notebook-copies")

    def wait(stem: str) -> Path:
        if stem not in copies.sources:
            pytest.skip(f"{stem} is not executed in this run: add --nbmake notebooks (make test)")
        deadline = time.monotonic() + WAIT
        while not copies.done(stem).exists():
            if time.monotonic() > deadline:
                pytest.fail(f"{stem}'s nbmake item did not finish within {WAIT} s")
            time.sleep(1)
        return copies.copy(stem)

    return wait


def stage_book(folder: Path, executed: list[Path]) -> None:
    """Copy the book's sources into ``folder``, with executed chapters and execution off."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"
    (folder / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.copy(ROOT / "_toc.yml", folder)
    for name in ("_static", "_ext"):
        shutil.copytree(ROOT / name, folder / name)
    (folder / "notebooks").mkdir()
    for path in NOTEBOOKS.glob("*.md"):
        shutil.copy(path, folder / "notebooks")
    for path in executed:
        # The kernel may send one print's text in pieces (its flush timer firing between the
        # writes, under load); JupyterLab shows consecutive pieces as one block, and so does
        # the book, joined by nbconvert's own preprocessor, where a page would otherwise split
        # a printed line over two blocks.
        nb = nbformat.read(path, as_version=4)
        nb, _ = CoalesceStreamsPreprocessor().preprocess(nb, {})
        nbformat.write(nb, folder / "notebooks" / path.name)


@pytest.fixture(scope="session")
def built_book(executed, tmp_path_factory):
    """The book built from this run's executed chapters, with warnings as errors: its HTML folder.

    A chapter that failed is still built (its page shows the error), so the other pages are
    checked all the same; the chapter's own nbmake item reports the failure. The landing page's
    map of the chapters is a Graphviz drawing, so without ``dot`` the book cannot build.
    """
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed, and the landing page's chapter map needs it")
    source = tmp_path_factory.mktemp("book")
    paths = [executed(stem) for stem in chapters()]
    stage_book(source, paths)
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
