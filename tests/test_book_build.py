"""The book builds with warnings as errors, and its pages show what the chapters computed.

Grouped by what is checked: errors and launch buttons on every chapter page in _toc.yml, then
the results the cells printed, the errors they provoke on purpose, tables, diagrams, plots and
forms, each listed per page. The pages are built from the chapters as nbmake executed them.
"""

import re
import shutil

import pytest
from conftest import FORM_PAGES, pages

from nbconventions import repository

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("book")]

CHAPTER_PAGES = [stem for stem in pages() if stem[:2].isdigit()]


def page(html, stem):
    return (html / "notebooks" / f"{stem}.html").read_text()


def images(text, kind):
    """The images of one kind (svg, png) the executed cells put on a page."""
    return re.findall(rf'<img[^>]+src="\.\./_images/[0-9a-f]+\.{kind}"', text)


def shortfalls(text, expected):
    """Each expected string a page shows fewer times than it should: (string, seen, wanted).

    ``expected`` lists strings (wanted at least once) and (string, at least) pairs.
    """
    pairs = [(e, 1) if isinstance(e, str) else e for e in expected]
    return [(s, text.count(s), n) for s, n in pairs if text.count(s) < n]


@pytest.mark.parametrize("stem", CHAPTER_PAGES)
def test_chapter_page_shows_no_error(built_book, stem):
    text = page(built_book, stem)
    assert "Traceback" not in text and "output error" not in text


@pytest.mark.parametrize("stem", CHAPTER_PAGES)
def test_colab_button_opens_the_chapter_on_main(built_book, stem):
    url, branch = repository()
    repo = url.removeprefix("https://github.com/")
    link = f"colab.research.google.com/github/{repo}/blob/{branch}/notebooks/{stem}.ipynb"
    assert link in page(built_book, stem)


# What cells printed after asserting it: the results the chapters check, as the reader sees them.
RESULTS = {
    "01_devices_and_meshes": [
        "8 devices, 8 local to process 0 of 1",
        "order along the mesh axis: [0, 1, 2, 3, 6, 7, 4, 5]",
    ],
    "02_sharded_arrays": ["each shard held by 4 devices"],
    "03_automatic_parallelism": [
        "all 9 layouts: output sharding and communication as expected",
        "Three more collectives on the 2x4 mesh",
    ],
    "04_explicit_sharding": [
        "float32[16@data,32@model]",
        "gradient with respect to v: float32[32,16@data]",  # the type of v
    ],
    "05_shard_map_and_collectives": ["values.sum(axis=0) = [1080 1088]"],
    "06_collective_matmul": [
        "block of B each device holds, step by step",
        "bytes sent per device: the same as the all-gather",
        "bytes sent per device: the same as the reduce-scatter",
        "6. bidirectional reduce-scatter ring",
    ],
    "07_data_parallelism": ["loss and gradients match the single-device reference"],
    "08_fsdp": ["FSDP with remat: same loss and updated parameters as one device"],
    "09_tensor_parallelism": ["counted from HLO vs formula", "18432 tokens: TP"],
    "12_performance": [
        "published peaks per chip",
        "bytes each device sends in one training step",
        "communication-bound on every chip listed",
        "GB/s, set by",  # which kernel set the measured bandwidth
    ],
    "14_pipeline_parallelism": [
        "the pipeline on 8 stages equals one device",
        "pipeline x data on the 2x4 mesh equals one device",
        "the forward scan saves",
        "pipeline x FSDP x TP on the 2x2x2 mesh equals one device",
    ],
    "15_experts_and_long_sequences": [
        "the MoE layer on 8 devices equals one device",
        "every order, and a random one, gives full causal attention back",
    ],
    "16_training_state": [
        "born sharded: every device",
        "the same bits on 3 layouts",
        "AdamW train state per device",
        "the same loss and gradients",
        "the estimate falls by",
        "resumed on 4 x 2",
        "resumed on 2 processes x 2 devices",
    ],
    "13_transformer_3d": [
        "every layout: loss and gradients equal to one device's",
        "TP + SP: loss and gradients equal to one device's",
        "as compiled here",
        "4 all-reduces of the local stream, with or without remat",
    ],
    "17_profiling": [
        "ran once on each of the 8 devices in each of the 3 steps",
        "traced again: 1 time",
        "two from the table: traced 1 time",
    ],
    "18_planning_a_real_run": ["TP over 8 devices, compiled and planned: equal to the byte"],
    "20_serving": [
        "every layout: the tokens of one device, token for token",
        "FLOPs per weight byte per prompt token",
    ],
    "19_a_training_run": [
        "1 collective, in the entry computation",
        "the losses up to step",
        "each read once, at the same step as in the reference",
        "the traced step moves 1 activation per layer to host memory",
    ],
    "21_newer_forms": [
        "gradients equal to one device's within rtol=1e-5, atol=1e-6",
        "Ulysses on 8 devices: output, dq, dk and dv equal one device's",
        "1F1B: 4 slots; the loss and gradients are one device's",
    ],
}

# Errors the chapters provoke on purpose, caught and explained on the page.
CAUGHT = {
    "02_sharded_arrays": ["mesh larger than the device count: ValueError"],
    "04_explicit_sharding": [("ShardingTypeError", 5)],  # four refusals and one mismatch
    "05_shard_map_and_collectives": ["so it is not a permutation"],
    "06_collective_matmul": ["The result differs from A @ B"],  # the mis-indexed ring
    "12_performance": ["MiB per device and per ring link for S = 1 MiB"],
    # the layout form's render_transformer, called with a mesh of too few axes
    "13_transformer_3d": ["rules name 3 mesh axes, data, fsdp, model, but the mesh 4x2 has 2"],
    # book.sizing refusing a plan, and a shape, in one sentence each
    "18_planning_a_real_run": [
        "does not split evenly over dp x fsdp x microbatches",
        "choose kv_heads that divides heads",
    ],
    # train.py refusing a layout and a mesh it cannot run, in one sentence each
    "19_a_training_run": ["argument --layout: invalid choice", "must give each axis of DP"],
    # book.cost refusing Ulysses on more devices than K/V heads, in one sentence
    "21_newer_forms": ["8 K/V heads do not split over 16 devices"],
    # book.sizing refusing a serving plan in one sentence, twice, in the form's HTML
    "20_serving": ["is more than the model", "does not split evenly over dp x fsdp"],
}

COLLECTIVE_TITLES = [
    "psum over i",
    "pmean over i",
    "all_gather, stacked (tiled=False)",
    "all_gather, tiled=True",
    "psum_scatter, scatter_dimension=1",
    "ppermute, shift",
    "ppermute, ring",
    "all_to_all: rows in, columns out",
]

# Shard tables (bk-dev, one per device) and tables of facts such as collectives (bk-table).
TABLES = {
    "02_sharded_arrays": [("class='bk-dev", 8 * 5)],
    "03_automatic_parallelism": [
        ("<table class='bk-table'>", 4),  # collectives and the nine layouts
        "<td>collective-permute</td>",
        "<td>all-to-all</td>",
        "<td>reduce-scatter</td>",
    ],
    "05_shard_map_and_collectives": [
        ("class='bk-dev", 3 * 8 * len(COLLECTIVE_TITLES)),  # before and after on 8 devices
        *(f"<b>{title}</b>" for title in COLLECTIVE_TITLES),
    ],
    "06_collective_matmul": [("<table class='bk-table'>", 6)],
    "14_pipeline_parallelism": ["pipeline x FSDP x TP on the 2x2x2 mesh"],
    "13_transformer_3d": [
        "per device, from memory_analysis()",  # the layout form's steps, side by side
        "FSDP x TP on the 2x4 mesh (fsdp=2, model=4)",  # the form's choice, called directly
        "<th>bytes sent per step (ring)</th>",
    ],
    # the collectives, device 0's instructions, the compile log, the cache's two processes
    "17_profiling": [("<table class='bk-table'>", 4), "<td>reduce-scatter</td>"],
    # presets, chips, rules of thumb, 2 memory, 2 bounds, the plan on 8,192 H100s and its
    # mesh, published, Meta's and MaxText's runs, the plan before launch, the form's layouts,
    # the compiled step beside its plan
    "18_planning_a_real_run": [
        ("<table class='bk-table'>", 14),
        "Llama 3 70B on 8,192 H100s",
        "step with TP over 8 devices, beside its plan",
        "quoted, then calculated",
    ],
    # the step's collectives, the traced step device by device, the interrupted run's attempts
    "19_a_training_run": [("<table class='bk-table'>", 3), "<td>all-reduce</td>"],
}


@pytest.mark.parametrize(
    "stem, expected",
    [
        *(pytest.param(s, e, id=f"results-{s}") for s, e in RESULTS.items()),
        *(pytest.param(s, e, id=f"caught-{s}") for s, e in CAUGHT.items()),
        *(pytest.param(s, e, id=f"tables-{s}") for s, e in TABLES.items()),
    ],
)
def test_page_shows_what_its_cells_computed(built_book, stem, expected):
    assert shortfalls(page(built_book, stem), expected) == []


# Graphviz drawings: svg images from book.display, an object from sphinx.ext.graphviz.
DIAGRAMS = {
    "01_devices_and_meshes": 3,  # the 2x4 and 2x2x2 meshes, the TPU v3-8 ring
    "03_automatic_parallelism": 1,  # the HLO graph
    "05_shard_map_and_collectives": 9,  # one per collective and option, and the 2D mesh
    "14_pipeline_parallelism": 1,  # the ring of stages a microbatch goes round
    "15_experts_and_long_sequences": 1,  # the ring K/V blocks travel
}


@pytest.mark.parametrize("stem", [*DIAGRAMS, "intro"])
def test_diagrams_are_drawn(built_book, stem):
    missing = [name for name in ("dot", "neato") if shutil.which(name) is None]
    if missing:
        pytest.skip(f"Graphviz's {' and '.join(missing)} not installed: diagrams are text")
    text = page(built_book, stem)
    if stem == "intro":  # the map of the chapters
        assert re.search(r'<object data="\.\./_images/graphviz-[0-9a-f]+\.svg"', text)
    else:
        assert len(images(text, "svg")) >= DIAGRAMS[stem]


PLOTS = {
    "07_data_parallelism": 1,  # the loss curve
    "08_fsdp": 1,  # the memory per device
    "12_performance": 2,  # the roofline and the bytes-against-formulas chart
    "14_pipeline_parallelism": 4,  # two schedules, the bubble against m, GPipe and 1F1B
    "15_experts_and_long_sequences": 2,  # drops per expert, and work per device on the ring
    "16_training_state": 1,  # float32 and bfloat16 loss curves
    "13_transformer_3d": 3,  # memory against depth, bytes against size, the loss curve
    "17_profiling": 1,  # the timeline of one traced step, device by device
    "18_planning_a_real_run": 1,  # a step's bound against the number of chips
    "19_a_training_run": 2,  # the traced step's timeline, the two runs' losses
    "20_serving": 2,  # the decode step's roofline, latency against throughput
}


@pytest.mark.parametrize("stem", PLOTS)
def test_plots_are_shown(built_book, stem):
    assert len(images(page(built_book, stem), "png")) >= PLOTS[stem]


def test_forms_are_on_their_pages_with_their_static_twins(built_book):
    """Every form page carries its kernel-free twin (bk-form) and its pre-rendered choices."""
    with_forms = [stem for stem in CHAPTER_PAGES if "class='bk-form'" in page(built_book, stem)]
    assert with_forms == list(FORM_PAGES)
    for stem in FORM_PAGES:
        assert "class='bk-data'" in page(built_book, stem), stem


def test_landing_page_says_how_to_read(built_book):
    text = re.sub(r"<[^>]+>", "", (built_book / "notebooks" / "intro.html").read_text())
    for way in ("Online", "In Colab", "In Kaggle", "Locally", "make lab", "TPU v5e-8"):
        assert way in text, way


def test_the_book_group_runs_on_one_worker(request):
    """Under ``--dist loadgroup`` each test of the group carries its name, so xdist sends the
    whole group to one worker and the book is built once; pytest 9.2 with pytest-xdist 3.8
    drops the name (pytest-xdist issue 1386), which would build it on both workers."""
    if not request.config.getoption("loadgroup", False):
        pytest.skip("only a run with --dist loadgroup groups tests")
    assert request.node.nodeid.endswith("@book")
