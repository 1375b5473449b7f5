"""The forms as a notebook reader meets them: live in JupyterLab with a kernel, in Chromium.

The rendered-book tests check the forms' kernel-free twins; these open a notebook of the five
live forms in a real JupyterLab, run it, change a choice in each form and check that its answer
changed, then save it, stop its kernel and reopen it, as a reader does the next day: where each
form was, the page must say how to get it back, not "Error displaying widget".
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest
from conftest import CHROMIUM, CHROMIUM_FLAGS, needs_chromium

import book.multihost

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("lab")]

# Each form's live widget, as its chapter shows it; the twins are the book's, not Lab's.
FORMS = {
    "sharding": 'book.forms.sharding_explorer("(8, 4)")',
    "collective": "book.forms.collective._widget()",
    "strategy": "book.forms.strategy._widget()",
    "transformer": "book.forms.transformer._widget()",
    "sizing": "book.forms.sizing._widget()",
}
SETUP = "import book.devices\n\nbook.devices.setup(8)\nimport book.display\nimport book.forms"
# Any table the book displays embeds its stylesheet, as every chapter's outputs do.
STYLED = f"book.display.table(['form'], [[name] for name in {list(FORMS)!r}])"
WAIT_MS = 180_000  # a loaded 2-core machine starts Lab, a kernel and JAX slowly


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a free local port over a folder with the forms' notebook."""
    folder = tmp_path_factory.mktemp("lab")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nb.cells = [nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_code_cell(STYLED)]
    nb.cells += [nbformat.v4.new_code_cell(code) for code in FORMS.values()]
    nbformat.write(nb, folder / "forms.ipynb")
    port = book.multihost.free_port()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "JUPYTER_CONFIG_DIR": str(folder / ".config")}
    server = subprocess.Popen(
        [
            os.path.join(os.path.dirname(sys.executable), "jupyter-lab"),
            "--no-browser",
            "--allow-root",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            "--ServerApp.token=",
            "--ServerApp.password=",
            "--ServerApp.disable_check_xsrf=True",  # the test stops the kernel over the REST API
            f"--ServerApp.root_dir={folder}",
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            with contextlib.suppress(OSError):
                get(f"{url}/api")
                break
            assert server.poll() is None, "JupyterLab stopped while starting"
            time.sleep(0.1)
        yield url, folder
    finally:
        # The server and the kernels it started share its session: end them all.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def open_notebook(browser, url):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{url}/lab/tree/forms.ipynb")
    page.wait_for_function(
        "window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell')", timeout=WAIT_MS
    )
    return page


def form_cell(page, k: int):
    """The cell of the k-th form (after the setup and the table)."""
    return page.locator(".jp-Notebook .jp-Cell").nth(2 + k)


@needs_chromium
def test_every_live_form_answers_a_change_and_a_reopened_one_says_how_to_get_it_back(lab):
    from playwright.sync_api import sync_playwright

    url, folder = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = open_notebook(browser, url)
        page.wait_for_function(
            "window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel",
            timeout=WAIT_MS,
        )
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        for k in range(len(FORMS)):
            cell = form_cell(page, k)
            select = cell.locator(".widget-dropdown select").first
            select.wait_for(timeout=WAIT_MS)
            cell.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            before = cell.locator(".jp-OutputArea").text_content()
            current = select.evaluate("s => s.selectedIndex")
            select.select_option(index=1 if current == 0 else 0)
            page.wait_for_function(  # the form answered the change
                "([cell, before]) => cell.textContent !== before",
                arg=[cell.locator(".jp-OutputArea").element_handle(), before],
                timeout=WAIT_MS,
            )
        page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_timeout(1000)
        for kernel in get(f"{url}/api/kernels"):
            request = urllib.request.Request(f"{url}/api/kernels/{kernel['id']}", method="DELETE")
            urllib.request.urlopen(request, timeout=10)
        page.close()

        saved = nbformat.read(folder / "forms.ipynb", as_version=4)
        assert all(c.outputs for c in saved.cells[2:]), "the forms' outputs were saved"
        page = open_notebook(browser, url)
        shown = page.locator(".jp-OutputArea-output.jupyter-widgets")
        page.wait_for_function(  # Lab renders the reopened outputs one cell at a time
            "n => document.querySelectorAll('.jp-OutputArea-output.jupyter-widgets').length >= n",
            arg=len(FORMS),
            timeout=WAIT_MS,
        )
        assert shown.count() == len(FORMS)
        for k in range(len(FORMS)):
            said = shown.nth(k).evaluate("e => getComputedStyle(e, '::after').content")
            assert "run the cells above it again" in said
            assert shown.nth(k).evaluate("e => getComputedStyle(e).fontSize") == "0px"
        browser.close()
