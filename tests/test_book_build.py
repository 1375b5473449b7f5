"""The book builds with warnings as errors, and its pages carry the executed outputs."""

import re
import shutil

import pytest

from nbconventions import ROOT, repository

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("book")]


@pytest.fixture(scope="module")
def html(built_book):
    return built_book


def page(html, stem):
    return (html / "notebooks" / f"{stem}.html").read_text()


def chapters():
    return sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_every_chapter_has_a_page_without_errors(html):
    for stem in chapters():
        text = page(html, stem)
        assert "Traceback" not in text and "output error" not in text, stem


def test_colab_buttons_point_at_each_chapter_on_main(html):
    url, branch = repository()
    repo = url.removeprefix("https://github.com/")
    for stem in chapters():
        link = f"colab.research.google.com/github/{repo}/blob/{branch}/notebooks/{stem}.ipynb"
        assert link in page(html, stem), stem


def test_chapter_01_shows_devices_and_diagrams(html):
    text = page(html, "01_devices_and_meshes")
    assert "8 devices, 8 local to process 0 of 1" in text
    diagrams = re.findall(r'<img[^>]+src="\.\./_images/[0-9a-f]+\.svg"', text)
    if shutil.which("neato"):
        assert len(diagrams) >= 3  # the 2x4 and 2x2x2 meshes, the TPU v3-8 ring
    assert "order along the mesh axis: [0, 1, 2, 3, 6, 7, 4, 5]" in text


def test_chapter_02_shows_shardings_and_shard_tables(html):
    text = page(html, "02_sharded_arrays")
    assert text.count("class='bk-dev'") >= 8 * 5
    assert "each shard held by 4 devices" in text
    assert "A 4x4 mesh needs 16 devices but there are 8" in text


def test_chapters_03_04_show_collective_tables_and_the_graph(html):
    text = page(html, "03_automatic_parallelism")
    assert text.count("<table class='bk-hlo'>") >= 4  # collectives and the nine layouts
    assert "all 9 layouts: output sharding and communication as expected" in text
    assert "Three more collectives on the 2x4 mesh" in text
    for op in ("collective-permute", "all-to-all", "reduce-scatter"):
        assert f"<td>{op}</td>" in text, op
    if shutil.which("dot"):
        assert re.search(r'<img[^>]+src="\.\./_images/[0-9a-f]+\.svg"', text)  # the HLO graph
    text = page(html, "04_explicit_sharding")
    assert "float32[16@data,32@model]" in text
    assert text.count("ShardingTypeError") >= 3
    assert "class='bk-hlo'" in text
    assert "<th>bytes sent (ring)</th>" in text


def test_landing_page_maps_the_chapters_and_says_how_to_read(html):
    text = (html / "notebooks" / "intro.html").read_text()
    assert re.search(r'<object data="\.\./_images/graphviz-[0-9a-f]+\.svg"', text)
    text = re.sub(r"<[^>]+>", "", text)
    for way in ("Online", "In Colab", "In Kaggle", "Locally", "make lab", "TPU v5e-8"):
        assert way in text, way


def test_chapters_07_to_09_show_plots_tables_and_the_strategy_form(html):
    plot = r'<img[^>]+src="\.\./_images/[0-9a-f]+\.png"'
    text = page(html, "07_data_parallelism")
    assert re.search(plot, text)  # the loss curve
    assert "loss and gradients match the single-device reference" in text
    text = page(html, "08_fsdp")
    assert re.search(plot, text)  # the memory per device
    assert "FSDP with remat: same loss and gradients as DP" in text
    text = page(html, "09_tensor_parallelism")
    assert "measured from HLO vs formula" in text
    assert "class='bk-form'" in text and "class='bk-data'" in text  # the static strategy form


def test_chapter_12_shows_the_roofline_the_cost_chart_and_their_tables(html):
    text = page(html, "12_performance")
    plots = re.findall(r'<img[^>]+src="\.\./_images/[0-9a-f]+\.png"', text)
    assert len(plots) >= 2  # the roofline and the bytes-against-formulas chart
    for caption in (
        "published peaks per chip",
        "bytes each device sends in one training step",
        "communication-bound on every chip listed",
        "MiB per device and per ring link for S = 1 MiB",  # shown, not swallowed
        "GB/s, set by",  # which kernel set the measured bandwidth
    ):
        assert caption in text, caption
