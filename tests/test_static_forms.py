"""The kernel-free twin of a form: every choice pre-rendered, stored once, safely embedded."""

import json
import re

import pytest

from book import static_forms
from book.errors import ReaderError


def data_of(page):
    return json.loads(re.search(r"class='bk-data'>(.*?)</script>", page).group(1))


def test_every_combination_is_rendered_once():
    calls = []

    def render(first, second):
        calls.append((first, second))
        return "even" if (len(first) + len(second)) % 2 == 0 else "odd"

    page = static_forms.static_form(
        ("letters", ["a", "bb"]), lambda v: [("pick", ["x", "yy", "z"][: len(v) + 1])], render
    )
    data = data_of(page)
    assert calls == [("a", "x"), ("a", "yy"), ("bb", "x"), ("bb", "yy"), ("bb", "z")]
    assert data["views"] == ["even", "odd"]  # identical renderings are stored once
    assert data["keys"] == {"a|x": 0, "a|yy": 1, "bb|x": 1, "bb|yy": 0, "bb|z": 1}
    assert data["rest"] == {"a": [["x", "yy"]], "bb": [["x", "yy", "z"]]}


def test_renderings_cannot_break_out_of_their_script():
    page = static_forms.static_form(
        ("k", ["v"]), lambda v: [], lambda v: "</script><script>alert(1)</script>"
    )
    embedded = re.search(r"class='bk-data'>(.*?)</script>", page, re.S).group(1)
    assert "</script>" not in embedded
    assert data_of(page)["views"] == ["</script><script>alert(1)</script>"]


def test_form_shows_the_widget_view_and_the_twin():
    import ipywidgets

    widget = ipywidgets.VBox([ipywidgets.Label("x")])
    bundle = static_forms.Form(widget, "<p>twin</p>")._repr_mimebundle_()
    assert bundle["text/html"] == "<p>twin</p>"
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == widget.model_id and view["version_major"] == 2


def test_choices_that_hold_the_separator_keep_keys_of_their_own():
    page = static_forms.static_form(
        ("n", ["x|y", "x", 3]),
        lambda v: [("m", ["z"] if v == "x|y" else ["y|z", 4])],
        lambda a, b: f"R({a},{b})",
    )
    data = data_of(page)
    shown = {key: data["views"][i] for key, i in data["keys"].items()}
    assert shown == {
        "x\\|y|z": "R(x|y,z)",
        "x|y\\|z": "R(x,y|z)",
        "x|4": "R(x,4)",
        "3|y\\|z": "R(3,y|z)",
        "3|4": "R(3,4)",
    }


@pytest.mark.parametrize(
    "rest, said",
    [
        (lambda v: [("chips", ["1"])] if v == "a" else [("batch", ["8"])], "same labels"),
        (lambda v: [("chips", ["1"])] if v == "a" else [("chips", ["1"]), ("s", ["2"])], "same"),
        (lambda v: [("chips", ["1"] if v == "a" else [])], "a control with no options"),
    ],
)
def test_controls_that_differ_between_values_are_refused_not_drawn_wrong(rest, said):
    with pytest.raises(ReaderError, match=said):
        static_forms.static_form(("model", ["a", "b"]), rest, lambda *a: ",".join(a))


@pytest.mark.parametrize(
    "first, render, said",
    [
        (("model", ["a"]), lambda *a: ["<p>a</p>"], "return the view's HTML as a text"),
        (("model", ["a"]), lambda *a: None, "return the view's HTML as a text"),
        (("model", []), lambda *a: "<p>a</p>", "has no options"),
    ],
)
def test_a_render_that_gives_no_text_or_a_control_without_options_is_refused(first, render, said):
    with pytest.raises(ReaderError, match=said):
        static_forms.static_form(first, lambda v: [("chips", ["1"])], render)


def bold(*choices):
    return "<b>" + "|".join(choices) + "</b>"


@pytest.mark.parametrize(
    "args, said",
    [
        ((("a", None), lambda v: [], bold), "first must be a (label, options) pair"),
        (("a", lambda v: [], bold), "first must be a (label, options) pair"),
        (((5, ["x"]), lambda v: [], bold), "not (5, ['x'])"),
        ((("a", ["x"]), lambda v: None, bold), "rest('x') gave None; return a list"),
        ((("a", ["x"]), lambda v: ["bb"], bold), "A control of rest('x') must be a (label"),
        ((("a", ["x"]), [("b", ["1"])], bold), "rest must be a function, not a list"),
        ((("a", ["x"]), lambda v: [], "<b>"), "render must be a function"),
    ],
)
def test_malformed_arguments_are_named_in_one_sentence(args, said):
    with pytest.raises(ReaderError, match=re.escape(said)) as caught:
        static_forms.static_form(*args)
    assert "\n" not in str(caught.value)
    with pytest.raises(ReaderError, match="note must be a text, not 5"):
        static_forms.static_form(("a", ["x"]), lambda v: [], bold, note=5)


def test_controls_of_too_many_combinations_are_refused_before_rendering():
    calls = []

    def render(*choices):
        calls.append(choices)
        return "<p>x</p>"

    many = [str(i) for i in range(300)]
    with pytest.raises(ReaderError, match="combinations to render"):
        static_forms.static_form(("a", many), lambda v: [("b", many), ("c", many)], render)
    with pytest.raises(ReaderError, match="options; a page can hold at most"):
        static_forms.static_form(("a", range(10**9)), lambda v: [], render)
    assert calls == []
