"""Every chapter executes as written, each reported on its own.

The run is the one the book build renders (see ``chapter_run`` in conftest.py), so the group
"book" keeps these tests on the worker that builds the book.
"""

import pytest
from conftest import chapters

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("book")]


@pytest.mark.parametrize("stem", chapters())
def test_chapter_executes_as_written(chapter_run, stem):
    run = chapter_run(stem)
    assert run.error is None, f"{stem} stopped (executed notebook: {run.path}):\n{run.error}"


def test_the_book_group_runs_on_one_worker(request):
    """Under ``--dist loadgroup`` each test of the group carries its name, so xdist sends the
    whole group to one worker and the chapters run once; pytest 9.2 with pytest-xdist 3.8 drops
    the name (pytest-xdist issue 1386), which would run every chapter on both workers."""
    if not request.config.getoption("loadgroup", False):
        pytest.skip("only a run with --dist loadgroup groups tests")
    assert request.node.nodeid.endswith("@book")
