"""Every chapter executes as written, each an nbmake item of ``make test``.

The chapters' own results come from nbmake (``notebooks/NN_name.ipynb::NN_name.ipynb``); the
book build and the stub checks read those runs, and are skipped in a run without them. So this
test holds ``make test`` to collecting one nbmake item per chapter, lest a changed command skip
them all and pass.
"""

import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, chapters

pytestmark = pytest.mark.slow


def test_make_test_executes_every_chapter_as_an_nbmake_item():
    shown = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True)
    lines = [line for line in shown.stdout.splitlines() if re.search(r"/pytest\s", line)]
    assert len(lines) == 1, shown.stdout + shown.stderr
    args = lines[0].split()[1:]
    # The same arguments on one process (-n 0), only collecting: each item's id, one a line,
    # whatever options this run was given through the environment.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-n", "0", "--collect-only", "-q"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    items = {line for line in collected.stdout.splitlines() if ".ipynb::" in line}
    missing = [stem for stem in chapters() if f"notebooks/{stem}.ipynb::{stem}.ipynb" not in items]
    assert not missing, f"make test executes no nbmake item for {missing}"
