"""The strategy form: a pure function of the reader's choices, a static twin, and widgets."""

import json
import re

import pytest

from book import forms
from book.forms import strategy


def test_mesh_choices_of_eight_devices():
    assert forms.strategy_mesh_choices("DP", 8) == ["8", "4", "2"]
    assert forms.strategy_mesh_choices("DP x TP", 8) == ["4x2", "2x4"]
    assert forms.strategy_mesh_choices("TP", 6) == ["4", "2"]


def test_render_shows_parameters_memory_and_collectives():
    page = forms.render_strategy("DP x TP", "4x2")
    assert "DP x TP on a 4x2 mesh (data=4, model=2)" in page
    assert "Parameters on each device: 41,536 of the model&#x27;s 83,008 bytes (50.0%)" in page
    assert "memory_analysis()" in page
    assert page.count("<td>all-reduce</td>") == 2
    assert "bk-viz bk-error" not in page


def test_fsdp_holds_an_eighth_of_the_parameters():
    page = forms.render_strategy("FSDP", "8")
    assert "10,376 of the model&#x27;s 83,008 bytes (12.5%)" in page
    assert "<td>all-gather</td>" in page and "<td>reduce-scatter</td>" in page


def test_a_single_device_has_no_collectives():
    assert "No collectives" in forms.render_strategy("DP", "1")


@pytest.mark.parametrize(
    "args, sentence",
    [
        (("PP", "8"), "is not a strategy here"),
        (("DP", "4x2"), "uses one mesh axis"),
        (("DP x TP", "8"), "needs a mesh with two axes"),
        (("TP", "16"), "needs 16 devices but there are 8"),
        (("DP", "3"), "batch size 256 over the 3 devices of data"),
        (("FSDP", "8", 256, 60), "features size 60"),
        (("TP", "8", 256, 64, 100), "hidden size 100 over the 8 devices of model"),
        (("DP x TP", "2x4", 256, 64, 254), "hidden size 254 over the 4 devices of model"),
        (("DP", "8", 0), "positive whole number"),
        (("DP", "8", "abc"), "positive whole number"),
        (("DP", "8", 10**6), "too large"),
        (("DP", "eight"), "Could not read"),
    ],
)
def test_bad_choices_give_one_sentence(args, sentence):
    page = forms.render_strategy(*args)
    assert "bk-viz bk-error" in page and sentence.replace("'", "&#x27;") in page
    assert "<table" not in page


def test_static_twin_offers_every_strategy_and_mesh(monkeypatch):
    monkeypatch.setattr(strategy, "_answer", lambda s, m, *sizes: f"<p>{s} on {m}</p>")
    page = forms.static_strategy_explorer()
    data = json.loads(re.search(r"class='bk-data'>(.*?)</script>", page).group(1))
    assert data["rest"]["DP x TP"] == [["4x2", "2x4"]]
    assert set(data["keys"]) == {
        *(f"{s}|{n}" for s in ("DP", "FSDP", "TP") for n in ("2", "4", "8")),
        "DP x TP|2x4",
        "DP x TP|4x2",
    }
    assert "<p>TP on 4</p>" in data["views"]


def test_widget_follows_the_choices(monkeypatch):
    monkeypatch.setattr(strategy, "static_strategy_explorer", lambda: "<p>twin</p>")
    form = forms.strategy_explorer()
    assert form.static_html == "<p>twin</p>"
    controls, out = form.widget.children
    strategy_box, mesh_box = controls.children
    assert mesh_box.options == ("8", "4", "2") and mesh_box.value == "8"
    assert "DP on an 8-device mesh (data=8)" in out.value
    strategy_box.value = "DP x TP"
    assert mesh_box.options == ("4x2", "2x4")
    assert "DP x TP on a 4x2 mesh" in out.value
    mesh_box.value = "2x4"
    assert "(data=2, model=4)" in out.value
    assert "MLP 64 → 256 → 16" in out.value  # the chapter's model: each change is a cached step


def test_the_forms_need_two_devices_and_offer_the_strategies_that_fit():
    from book.errors import ReaderError
    from book.forms import common, strategy

    with pytest.raises(ReaderError, match="needs at least 9 devices, and JAX has 8"):
        common.device_count_for("strategy form", least=9)
    assert "DP x TP" not in strategy._offered(2) and "DP x TP" in strategy._offered(4)
    assert strategy._offered(2) == [s for s in strategy.STRATEGY_EXPLAINED if s != "DP x TP"]
