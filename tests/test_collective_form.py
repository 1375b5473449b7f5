"""The collective explorer: real collectives per device, and one sentence for every bad choice."""

import html
import json
import re
import shutil

import numpy as np
import pytest

from book import forms


def error_of(page: str) -> str | None:
    found = re.search(r"bk-error'>(.*?)</div>", page)
    return html.unescape(found.group(1)) if found else None


def rows_of(page: str) -> list[list[list[int]]]:
    """Each table cell's numbers, in order: device label, before, after per device."""
    cells = re.findall(r"<div class='bk-dev[^']*'>(.*?)</div>", page)
    return [[float(v) for v in re.findall(r"<td>(-?[\d.]+)</td>", c)] for c in cells]


def test_block_values_name_device_and_position():
    np.testing.assert_array_equal(forms.block_values(3, (4,)), [130, 131, 132, 133])
    assert forms.block_values(7, (4, 4))[3, 3] == 1715
    assert forms.block_values(0, (1,)).tolist() == [100]


def test_psum_over_the_whole_line():
    page = forms.render_collective("psum", "(8,)", "data", block_shape="(2,)")
    assert error_of(page) is None
    cells = rows_of(page)
    expected = sum(forms.block_values(d, (2,)) for d in range(8)).tolist()
    assert [cells[3 * d + 2] for d in range(8)] == [expected] * 8
    assert "all 8 devices take part" in page


def test_a_mesh_smaller_than_the_devices_runs_on_the_first_ones():
    page = forms.render_collective("psum", "2x2", "model", block_shape="(1,)")
    assert error_of(page) is None
    after = [rows_of(page)[3 * d + 2] for d in range(4)]
    assert after == [[100 + 110]] * 2 + [[120 + 130]] * 2


def test_psum_over_one_axis_of_a_2d_mesh_runs_in_groups():
    page = forms.render_collective("psum", "2x4", "model", block_shape="(1,)")
    assert "2 groups of 4" in page and "[0, 1, 2, 3], [4, 5, 6, 7]" in page
    after = [rows_of(page)[3 * d + 2] for d in range(8)]
    assert after == [[100 + 110 + 120 + 130]] * 4 + [[140 + 150 + 160 + 170]] * 4


@pytest.mark.parametrize(
    "collective, options, after_shape",
    [
        ("pmean", {}, (4,)),
        ("all_gather", {}, (8, 4)),
        ("all_gather", {"tiled": True}, (32,)),
        ("all_gather", {"dimension": 1}, (4, 8)),
        ("psum_scatter", {"block_shape": "(8, 2)"}, (2,)),
        ("psum_scatter", {"tiled": True, "block_shape": "(16,)"}, (2,)),
        ("ppermute", {"perm": "ring"}, (4,)),
        ("ppermute", {"perm": "[(0, 7), (7, 0)]"}, (4,)),
        ("all_to_all", {"block_shape": "(8, 2)", "concat_dimension": 1}, (2, 8)),
        ("all_to_all", {"tiled": True, "block_shape": "(16,)"}, (16,)),
    ],
)
def test_every_collective_and_option_renders(collective, options, after_shape):
    options = {"block_shape": "(4,)", **options}
    page = forms.render_collective(collective, "(8,)", "data", **options)
    assert error_of(page) is None
    assert f"after {after_shape} " in page


def test_ring_moves_each_block_to_the_next_device():
    page = forms.render_collective("ppermute", "(8,)", "data", block_shape="(2,)", perm="ring")
    cells = rows_of(page)
    for d in range(8):
        assert cells[3 * d + 2] == forms.block_values((d - 1) % 8, (2,)).tolist()
    assert "device 7 (data=7)" in page


@pytest.mark.parametrize(
    "args, options, sentence",
    [
        (("psum", "(8,)", "model"), {}, "Axis 'model' is not in the mesh"),
        (("ppermute", "(8,)", "data"), {"perm": "(0, 1), (1, 1)"}, "not a permutation"),
        (("ppermute", "(8,)", "data"), {"perm": "(0, 1), (0, 2)"}, "Index 0 sends twice"),
        (("ppermute", "2x4", "model"), {"perm": "(0, 4)"}, "indexed 0 to 3"),
        (("ppermute", "(8,)", "data"), {"perm": "__import__('os')"}, "Could not read"),
        (("psum_scatter", "2x4", "model"), {"block_shape": "(6,)", "tiled": True}, "multiple of 4"),
        (("psum_scatter", "2x4", "model"), {"block_shape": "(8,)"}, "exactly 4 entries"),
        (("all_to_all", "(8,)", "data"), {"block_shape": "(4,)"}, "exactly 8 entries"),
        (("all_to_all", "(8,)", "data"), {"tiled": True, "block_shape": "(12,)"}, "multiple of 8"),
        (("all_to_all", "(8,)", "data"), {"concat_dimension": 1}, "concat dimension is 1"),
        (("all_gather", "(8,)", "data"), {"dimension": 2}, "gather dimension is 2"),
        (("all_gather", "(8,)", "data"), {"dimension": "one"}, "whole number"),
        (("broadcast", "(8,)", "data"), {}, "is not a collective here"),
        (("psum", "(4, 4)", "data"), {}, "needs 16 devices"),
        (("psum", "(8,)", "data"), {"block_shape": "(9, 9)"}, "at most 64"),
        (("psum", "(2, 4)", "data"), {"axis_names": "data, data"}, "appears twice"),
    ],
)
def test_bad_choices_give_one_sentence(args, options, sentence):
    page = forms.render_collective(*args, **options)
    message = error_of(page)
    assert message is not None and sentence in message, message
    assert message.count(". ") == 0 and message.endswith(".")
    assert "<b>device" not in page


def test_an_axis_name_whose_own_comparisons_fail_is_read_as_its_text():
    from hostile_values import lying

    page = forms.render_collective("psum", "(8,)", lying("text", "data"), block_shape="(2,)")
    assert error_of(page) is None
    assert "is not in the mesh" in error_of(
        forms.render_collective("psum", "(8,)", lying("text", "model"))
    )


def test_the_data_movement_diagram_is_drawn():
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed, so the diagram is text")
    page = forms.render_collective("psum", "(8,)", "data", block_shape="(2,)")
    assert "<div class='bk-diagram'><svg" in page


def test_a_repeated_choice_is_answered_from_the_cache():
    """Going back to a choice reuses its page, so it answers without running JAX again.

    How fast a new choice answers is measured by ``make bench``, not asserted here.
    """
    from book.forms import collective

    first = forms.render_collective("pmean", "4x2", "model", block_shape="(3,)")
    hits = collective._body.cache_info().hits
    assert forms.render_collective("pmean", "4x2", "model", block_shape="(3,)") == first
    assert collective._body.cache_info().hits == hits + 1


def test_static_twin_offers_every_collective_and_switches_views():
    page = forms.static_collective_explorer()
    data = json.loads(re.search(r"class='bk-data'>(.*?)</script>", page, re.S).group(1))
    assert set(data["rest"]) == set(forms.COLLECTIVES)
    assert "2x4, axis model" in data["rest"]["psum"][0]
    assert data["rest"]["ppermute"][1] == ["perm=shift", "perm=ring"]
    shift = data["views"][data["keys"]["ppermute|8, axis data|perm=shift"]]
    ring = data["views"][data["keys"]["ppermute|8, axis data|perm=ring"]]
    assert shift != ring
    assert not any("bk-error" in v for v in data["views"])


def test_explorer_widgets_follow_the_choices():
    form = forms.collective_explorer()
    controls, out = form.widget.children
    kind_box, mesh_box, axis_box = controls.children[0].children
    block_box, dim_box, concat_box, tiled_box, perm_box = controls.children[1].children
    assert "psum(block, 'data')" in html.unescape(out.value)
    mesh_box.value = (2, 4)
    assert list(axis_box.options) == ["data", "model"]
    kind_box.value = "ppermute"
    assert perm_box.layout.display == "" and dim_box.layout.display == "none"
    perm_box.value = "(0, 0)"
    assert error_of(out.value) is None
    perm_box.value = "(0, 1), (1, 1)"
    assert "not a permutation" in error_of(out.value)
    assert "text/html" in form._repr_mimebundle_()


@pytest.mark.parametrize(
    "text, pairs",
    [
        ("((0, 1), (1, 0))", ((0, 1), (1, 0))),  # the tuple jax.lax.ppermute takes
        ("((0, 1),)", ((0, 1),)),
        ("[(0, 1), (1, 0)]", ((0, 1), (1, 0))),
    ],
)
def test_permutations_are_read_as_python_writes_them(text, pairs):
    from book.forms import collective

    assert collective.parse_perm(text, 2) == pairs


@pytest.mark.parametrize("text", ["(0, 1)()", "((0, 1)", "(0, 1))"])
def test_stray_parentheses_are_refused(text):
    from book import specs
    from book.forms import collective

    with pytest.raises(specs.SpecError, match="Could not read"):
        collective.parse_perm(text, 2)
