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
