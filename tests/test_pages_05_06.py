"""The rendered pages of chapters 05 and 06 carry their tables, diagrams, form and checks."""

import re
import shutil

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("book")]


def page(html, stem):
    return (html / "notebooks" / f"{stem}.html").read_text()


def test_chapter_05_shows_every_collective_with_table_and_diagram(built_book):
    text = page(built_book, "05_shard_map_and_collectives")
    titles = [
        "psum over i",
        "pmean over i",
        "all_gather, stacked (tiled=False)",
        "all_gather, tiled=True",
        "psum_scatter, scatter_dimension=1",
        "ppermute, shift",
        "ppermute, ring",
        "all_to_all: rows in, columns out",
    ]
    for title in titles:
        assert f"<b>{title}</b>" in text, title
    assert text.count("class='bk-dev'") >= 3 * 8 * len(titles)
    if shutil.which("neato"):
        diagrams = re.findall(r'<img[^>]+src="\.\./_images/[0-9a-f]+\.svg"', text)
        assert len(diagrams) >= 9  # one per collective and option, and the 2D mesh
    assert "values.sum(axis=0) = [1080 1088]" in text
    assert "class='bk-form'" in text  # the explorer's kernel-free twin
    assert "so it is not a permutation" in text


def test_chapter_06_shows_checks_collectives_and_timings(built_book):
    text = page(built_book, "06_collective_matmul")
    assert "block of B each device holds, step by step" in text
    assert "The result differs from A @ B" in text  # the mis-indexed ring, caught
    assert "bytes sent per device: the same as the all-gather" in text
    assert "bytes sent per device: the same as the reduce-scatter" in text
    assert "6. bidirectional reduce-scatter ring" in text
    assert text.count("<table class='bk-hlo'>") >= 6
