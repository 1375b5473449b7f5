"""Every chapter executes as written, each reported on its own.

The run is the one the book build renders (``chapter_run`` in conftest.py). These tests belong
to no xdist group: the worker that builds the book executes chapters from the last, the other
from the first, and no chapter runs twice.
"""

import pytest
from conftest import chapters

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stem", chapters())
def test_chapter_executes_as_written(chapter_run, stem):
    run = chapter_run(stem)
    assert run.error is None, f"{stem} stopped (executed notebook: {run.path}):\n{run.error}"
