"""The sharding explorer: a pure function of the reader's texts, and widgets around it."""

import html
import json
import re
import subprocess
import sys

import pytest
from hostile_values import lying

from book import display, forms


def test_mesh_shapes_of_eight():
    assert forms.mesh_shapes(8) == [(8,), (1, 8), (2, 4), (4, 2), (8, 1), (2, 2, 2)]


def test_spec_choices_follow_the_axis_names():
    assert forms.spec_choices(("data", "model")) == [
        "None",
        "'data'",
        "'model'",
        "('data', 'model')",
        "('model', 'data')",
    ]
    # a list subclass whose own len() and iteration fail: read for the names it holds
    assert forms.spec_choices(lying("list", ["data"])) == ["None", "'data'"]


def test_render_good_choice_shows_every_device():
    html = forms.render_sharding("(8, 4)", "(2, 4)", "('data', 'model')", "P('data', 'model')")
    assert len(re.findall(r"<b>device \d</b>", html)) == 8
    assert "16 of 128 bytes per device" in html


def test_a_mesh_smaller_than_the_devices_takes_the_first_ones():
    """As jax.make_mesh does: a 2x2 mesh on 8 devices places the array on devices 0 to 3."""
    html = forms.render_sharding("(8, 4)", "(2, 2)", "('data', 'model')", "P('data', 'model')")
    assert sorted(re.findall(r"<b>device (\d)</b>", html)) == ["0", "1", "2", "3"]
    assert "class='bk-error'" not in html


def test_render_3d_mesh_and_auto_axes():
    html = forms.render_sharding("(4, 4, 2)", "2x2x2", "a, b, c", "P('a', 'b', 'c')", "Auto")
    assert "each shard held by 1 device" in html


@pytest.mark.parametrize(
    "args, sentence",
    [
        (("(8, 4)", "(2, 4)", "data, model", "P('data', 'data')"), "is used twice"),
        (("(8, 4)", "(2, 4)", "data, model", "P('rows')"), "is not in the mesh"),
        (("(6, 4)", "(2, 4)", "data, model", "P('model')"), "cannot split evenly"),
        (("(8, 4)", "(4, 4)", "data, model", "P()"), "needs 16 devices but there are 8"),
        (("(8,)", "(2, 4)", "data, model", "P('data', None)"), "array has rank 1"),
        (("(8, 4)", "(2, 4)", "data", "P()"), "one name per axis"),
        (("(8, 4)", "(2, 4)", "data, model", "__import__('os')"), "is not allowed"),
        (("(8, four)", "(2, 4)", "data, model", "P()"), "Could not read 'four'"),
        (("(128, 128)", "(2, 4)", "data, model", "P()"), "keep it under"),
    ],
)
def test_render_bad_choices_give_one_sentence(args, sentence):
    html = forms.render_sharding(*args)
    assert "bk-error" in html and sentence.replace("'", "&#x27;") in html
    assert "<b>device" not in html


def test_explorer_widgets_follow_the_choices():
    form = forms.sharding_explorer("(8, 4)")
    controls, dims, spec_label, out = form.widget.children
    mesh_box = controls.children[0].children[1]
    names_box = controls.children[1].children[0]
    assert [d.description for d in dims.children] == ["dim 0", "dim 1"]
    dims.children[0].value = "'data'"
    assert spec_label.value == "<code>P('data', None)</code>"
    assert "4 of 8" not in out.value and "each shard held by 4 devices" in out.value
    mesh_box.value = (2, 2, 2)  # three axes: the names follow
    assert names_box.value == "pipe, data, model"
    assert "'pipe'" in dims.children[0].options
    dims.children[0].value = "'pipe'"
    dims.children[1].value = "'pipe'"
    assert "used twice" in out.value


def test_explorer_keeps_the_spec_while_a_shape_or_names_are_typed():
    form = forms.sharding_explorer("(8, 4)")
    controls, dims, spec_label, out = form.widget.children
    shape_box, names_box = controls.children[0].children[0], controls.children[1].children[0]
    dims.children[0].value = "'data'"
    dims.children[1].value = "'model'"
    # Every keystroke of "(16, 4)" typed over the old shape, then the names retyped.
    for typed in ["", "(", "(1", "(16", "(16,", "(16, ", "(16, 4", "(16, 4)", "16", "16, 4"]:
        shape_box.value = typed
    for typed in ["", "data", "data,", "data, mod", "data, model"]:
        names_box.value = typed
    assert spec_label.value == "<code>P('data', 'model')</code>"
    assert "(16, 4) sharded as P('data', 'model')" in html.unescape(out.value)
    shape_box.value = "(16, x)"
    assert "Could not read 'x' in the shape" in html.unescape(out.value)
    assert spec_label.value == "<code>P('data', 'model')</code>"


def test_explorer_shows_the_widget_to_a_kernel_and_the_twin_to_the_book():
    bundle = forms.sharding_explorer("(8, 4)")._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "<select>" in bundle["text/html"] and "bk-data" in bundle["text/html"]


def test_static_twin_holds_every_choice():
    twin = forms.static_sharding_explorer("(8, 4)")
    data = json.loads(re.search(r"class='bk-data'>(.*?)</script>", twin).group(1))
    # 1D mesh: 2 choices per dimension; four 2D meshes: 5; the 2x2x2 mesh: 10
    assert len(data["keys"]) == 2**2 + 4 * 5**2 + 10**2
    key = "2x4|'data'|'model'"
    shown = forms.render_sharding("(8, 4)", "2x4", "data, model", "P('data', 'model')")
    assert display.styled(data["views"][data["keys"][key]]) == shown
    assert "is used twice" in data["views"][data["keys"]["2x4|'data'|'data'"]]


@pytest.mark.parametrize(
    "kwargs, sentence",
    [
        ({"array_shape": "(8, ²)"}, "digits 0 to 9"),
        ({"mesh_shape": "8" + "x1" * 39}, "use at most 8"),
        ({"axis_type": ["Auto"]}, "is not an axis type here"),
        ({"show_ids": "False"}, "True or False, not 'False'"),
        ({"spec": None}, "as text"),
    ],
)
def test_render_odd_arguments_give_one_sentence(kwargs, sentence):
    args = {
        "array_shape": "(8, 4)",
        "mesh_shape": "(2, 4)",
        "axis_names": "data, model",
        "spec": "P()",
    }
    args.update(kwargs)
    page = forms.render_sharding(**args)
    assert "bk-error" in page and sentence.replace("'", "&#x27;") in page


@pytest.mark.parametrize(
    "kwargs, sentence",
    [
        ({"dimension": "--1"}, "whole number such as 0"),
        ({"dimension": "①"}, "digits 0 to 9"),
        ({"dimension": 10**10000}, "about 10,001 digits"),
        ({"tiled": "False"}, "True or False"),
        ({"collective": ["psum"]}, "is not a collective here"),
        ({"collective": "ppermute", "perm": "(0, " + "9" * 5000 + ")"}, "under 200 characters"),
        ({"diagram": "no"}, "True or False"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_collective_odd_arguments_give_one_sentence(kwargs, sentence):
    args = {"collective": "all_gather", "mesh_shape": "(8,)", "axis": "data"}
    args.update(kwargs)
    page = forms.render_collective(**args)
    assert "bk-error" in page and sentence in page


def test_strategy_odd_arguments_give_one_sentence():
    assert "is not a strategy here" in forms.render_strategy(["DP"], "8")
    assert "not True" in forms.render_strategy("DP", "8", batch=True)
    assert "digits 0 to 9" in forms.render_strategy("DP", "8", batch="²")


@pytest.mark.parametrize("shape", [(8, 4), 8, ["(8, 4)"]])
def test_a_shape_that_is_not_text_gets_one_sentence_before_any_widget(shape):
    from book.specs import SpecError

    with pytest.raises(SpecError, match="as text"):
        forms.sharding_explorer(shape)


def test_the_static_explorer_reads_a_text_subclass_for_what_it_holds():
    class Unformatted(str):
        def __format__(self, spec):
            raise RuntimeError("format")

    def page(shape):
        return re.sub(r"bk-form-\w+", "", forms.static_sharding_explorer(shape))

    assert page(Unformatted("(8,)")) == page("(8,)")


def test_the_static_explorer_refuses_ranks_it_cannot_prerender():
    from book.specs import SpecError

    with pytest.raises(SpecError, match="rank at most 3"):
        forms.static_sharding_explorer("(2, 2, 2, 2)")


@pytest.mark.parametrize(
    "args, words",
    [
        (((16,), ("x",)), "needs 16 devices but there are 8"),
        (((8,), ("data",), "__class__"), "is not an axis type"),
        (((4, 2), ("data",)), "must name each of the 2 axes"),
    ],
)
def test_a_forms_mesh_of_odd_arguments_is_refused_in_one_sentence(args, words):
    from book.errors import ReaderError
    from book.forms import common

    with pytest.raises(ReaderError, match=words):
        common.mesh(*args)
    assert common.mesh([8], ["data"]).shape == {"data": 8}  # a list is a shape too


FEW_DEVICES = """
import re, sys
import book.devices
book.devices.setup(int(sys.argv[1]))
from book import forms
shown = [w for w in forms.sharding_explorer().widget.children if type(w).__name__ == "HTML"]
print(re.sub(r"<[^>]+>", " ", shown[-1].value))
"""


@pytest.mark.parametrize("devices", [1, 4])
def test_the_sharding_explorer_opens_on_a_table_where_no_2x4_mesh_fits(devices):
    """Its first mesh is then 1-D: the names box must start with one name, not two."""
    done = subprocess.run(
        [sys.executable, "-c", FEW_DEVICES, str(devices)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sharded as P(None, None)" in done.stdout and "names were given" not in done.stdout
