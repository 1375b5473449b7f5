"""The transformer form: the chapter's rules tables on meshes, a static twin, and widgets."""

import json
import re

import numpy as np
import pytest
from hostile_values import lying

from book import forms, layouts
from book.errors import ReaderError
from book.forms import transformer
from book.lessons import transformer as lesson


def test_the_tables_are_the_chapters():
    assert {k: layouts.TABLES[k] for k in lesson.RULES} == lesson.RULES
    assert layouts.TABLES["TP + SP"] == lesson.SP_RULES


def test_each_table_is_offered_the_meshes_of_8_devices_with_its_axes():
    assert layouts.mesh_axes(lesson.RULES["DP x FSDP x TP"]) == ("data", "fsdp", "model")
    assert layouts.mesh_axes(lesson.RULES["FSDP x TP"]) == ("fsdp", "model")
    assert transformer.mesh_choices("DP") == ["8"]
    assert transformer.mesh_choices("FSDP x TP") == ["4x2", "2x4"]
    assert transformer.mesh_choices("DP x FSDP x TP") == ["2x2x2"]


@pytest.mark.parametrize("rules", [8.0, "DP", {"batch": 8}, {"batch": ("data", "data")}])
def test_mesh_axes_refuses_what_is_no_rules_table_in_one_sentence(rules):
    with pytest.raises(ReaderError) as caught:
        layouts.mesh_axes(rules)
    assert "\n" not in str(caught.value) and str(caught.value).endswith(".")


def test_mesh_axes_reads_a_dict_subclass_for_what_it_holds():
    assert layouts.mesh_axes(lying("dict", {"batch": ("data", "fsdp")})) == ("data", "fsdp")


@pytest.mark.parametrize(
    "call, sentence",
    [
        (lambda: transformer.mesh_choices("nope"), "'nope' is not a rules table here"),
        (lambda: transformer.mesh_choices(None), "None is not a rules table here"),
        (lambda: layouts.remember({("DP",): 1}), "is a (table, mesh shape) pair"),
        (lambda: layouts.remember({"DP": 1}), "is a (table, mesh shape) pair"),
        (lambda: layouts.check("TP + SP", "8", 8, 15), "seq dimension of the residual stream"),
        (lambda: layouts.remember(lying("dict", {"DP": 1})), "is a (table, mesh shape) pair"),
        (lambda: forms.transformer_explorer(lying("list", [1])), "must be a dict"),
        (lambda: forms.transformer_explorer(np.zeros(2)), "must be a dict"),
    ],
)
def test_bad_calls_of_the_helpers_give_one_sentence(call, sentence):
    from book import specs

    with pytest.raises(specs.SpecError, match=re.escape(sentence)):
        call()


def test_a_choice_names_its_mesh_axes_from_the_rules():
    choice = forms.check_transformer("FSDP x TP", "2x4")
    assert choice.axis_names == ("fsdp", "model") and choice.mesh_shape == (2, 4)
    assert choice.where == "the 2x4 mesh (fsdp=2, model=4)"
    assert forms.check_transformer({"batch": "data"}, [8]).name == "your rules"


@pytest.mark.parametrize(
    "args, sentence",
    [
        (("PP", "8"), "is not a rules table here"),
        (("DP", "4x2"), "DP's rules name data, but the mesh 4x2 has 2 sizes"),
        (("FSDP x TP", "8"), "name 2 mesh axes, fsdp, model, but the mesh 8 has 1 size"),
        (("DP", "16"), "needs 16 devices but there are 8"),
        (("DP", "3"), "split the batch dimension of the batch of tokens, 8, over data (3 devices)"),
        (("FSDP", "8", 12), "the batch of tokens, 12, over fsdp"),
        (
            ({"embed": "fsdp"}, "3"),
            "split the embed dimension of blocks/attn_norm, 64, over fsdp (3 devices)",
        ),
        (("DP", "8", 0), "positive whole number"),
        (("DP", "8", 8, "abc"), "The seq size must be a positive whole number"),
        (("DP", "eight"), "Could not read"),
        (("DP", None), "must be text such as &#x27;4x2&#x27; or sizes"),
        ((42, "8"), "a table&#x27;s name or a dict"),
        (({"emb": "data"}, "8"), "&#x27;emb&#x27; is not a logical name of this model"),
        (({"batch": ["data"]}, "8"), "give a mesh axis name, a tuple of them or None"),
        (({"batch": ("data", "data")}, "8"), "names a mesh axis twice"),
        (({"batch": "da ta"}, "8"), "A mesh axis must be a name"),
        (({}, "8"), "name no mesh axis"),
        (({"batch": None}, "8"), "name no mesh axis"),
    ],
)
def test_bad_choices_give_one_sentence(args, sentence):
    page = forms.render_transformer(*args)
    assert "bk-viz bk-error" in page and sentence.replace("'", "&#x27;") in page
    assert "<table" not in page
    message = re.search(r"bk-error'>(.*?)</div>", page).group(1)
    assert "\n" not in message and message.endswith(".")


def test_render_shows_what_each_device_holds_its_memory_and_collectives():
    page = forms.render_transformer("DP", "8")
    assert "DP on 8 devices in a line (data=8)" in page
    assert "Parameters on each device: 263,424 of the model&#x27;s 263,424 bytes (100.0%)" in page
    assert "from compiled.memory_analysis()" in page
    assert "<td>all-reduce</td><td>data</td>" in page  # the gradients, over data
    assert "bk-viz bk-error" not in page


def test_a_step_compiled_elsewhere_is_used_only_for_its_own_choice():
    dp, fsdp = (forms.check_transformer(t, "8") for t in ("DP", "FSDP"))
    step = layouts._compiled(dp)
    assert layouts._fits(step, dp)
    assert not layouts._fits(step, fsdp)  # other shardings
    assert not layouts._fits(step, forms.check_transformer("DP", "8", batch=16))
    assert not layouts._fits("not a program", dp)


def test_static_twin_offers_every_table_on_its_meshes(monkeypatch):
    monkeypatch.setattr(transformer, "_answer", lambda t, m: f"<p>{t} on {m}</p>")
    page = forms.static_transformer_explorer()
    data = json.loads(re.search(r"class='bk-data'>(.*?)</script>", page).group(1))
    assert set(data["keys"]) == {
        "DP|8",
        "FSDP|8",
        "TP|8",
        "FSDP x TP|4x2",
        "FSDP x TP|2x4",
        "DP x FSDP x TP|2x2x2",
        "TP + SP|8",
    }
    assert data["rest"]["FSDP x TP"] == [["4x2", "2x4"]]
    assert "<p>TP + SP on 8</p>" in data["views"]


def test_widget_follows_the_choices(monkeypatch):
    monkeypatch.setattr(transformer, "static_transformer_explorer", lambda: "<p>twin</p>")
    monkeypatch.setattr(transformer, "_answer", lambda t, m, *sizes: f"<p>{t} on {m}</p>")
    form = forms.transformer_explorer()
    assert form.static_html == "<p>twin</p>"
    controls, out = form.widget.children
    table_box, mesh_box = controls.children
    assert mesh_box.options == ("8",) and "DP on 8" in out.value
    table_box.value = "FSDP x TP"
    assert mesh_box.options == ("4x2", "2x4") and "FSDP x TP on 4x2" in out.value
    mesh_box.value = "2x4"
    assert "FSDP x TP on 2x4" in out.value


def test_layout_takes_a_choice_and_check_takes_read_only_rules():
    from types import MappingProxyType

    from book.errors import ReaderError

    for odd in (None, "FSDP", ("FSDP", "4x2")):
        with pytest.raises(ReaderError, match="layout takes a Choice"):
            layouts.layout(odd)
    rules = MappingProxyType({"batch": "data"})
    assert layouts.check(rules, "8") == layouts.check({"batch": "data"}, "8")
