"""The sizing form: a pure function of the reader's choices, a static twin, and widgets."""

import json
import re

import pytest

from book import sizing
from book.forms import sizing as form


def test_render_shows_memory_and_the_bound():
    page = form.render_sizing("Llama 3 70B", "TPU v5p", "FSDP x TP, SP", "1024")
    assert "Llama 3 70B on 1,024 TPU v5p chips, FSDP x TP, SP (fsdp=128, tp=8)" in page
    assert "The counted state and activations fit in its 102 GB of HBM (95.0 GiB)" in page
    assert "GiB per device" in page and "MFU at most" in page
    assert "(ICI)" in page and "bk-viz bk-error" not in page


def test_a_layout_too_large_for_the_chip_says_so():
    page = form.render_sizing("Llama 3 70B", "TPU v6e", "FSDP x TP", "256")
    assert "The counted state and activations do not fit in its 32 GB of HBM (29.8 GiB)" in page


@pytest.mark.parametrize(
    "args, sentence",
    [
        (("Llama 3 9B", "H100", "FSDP", "256"), "is not a model here"),
        (("Llama 3 8B", "TPU v9", "FSDP", "256"), "is not a chip here"),
        (("Llama 3 8B", "H100", "ZeRO", "256"), "is not a layout here"),
        (("Llama 3 8B", "H100", "FSDP x TP", "12"), "needs a multiple of 8 chips"),
        (("Llama 3 8B", "H100", "FSDP", "eight"), "positive whole number"),
        (("Llama 3 8B", "H100", "FSDP", "99999"), "too large"),
        (("Llama 3 8B", "H100", "FSDP", "256", "1000"), "does not split evenly"),
        (("Llama 3 8B", "H100", "FSDP", "256", 1024, "0"), "must be at least 128"),
        (("Llama 3 8B", "H100", "FSDP", "256", 1024, "1"), "must be at least 128"),
        (("Llama 3 8B", "H100", "FSDP", "256", 1024, "2147483647"), "context window"),
    ],
)
def test_bad_choices_give_one_sentence(args, sentence):
    page = form.render_sizing(*args)
    assert "bk-viz bk-error" in page and sentence in page.replace("&#x27;", "'")
    assert "<table" not in page


@pytest.mark.parametrize(
    "chips, words",
    [
        (0, "not 0"),
        (-8, "not -8"),
        ("8", "not '8' (a string)"),
        (None, "not None"),
        (8.5, "not 8.5"),
        (True, "not True"),
        (10**30, "too large"),
    ],
)
def test_layout_degrees_refuses_a_chip_count_in_one_sentence(chips, words):
    with pytest.raises(sizing.SizingError) as caught:
        form.layout_degrees("FSDP", chips)
    assert words in str(caught.value) and "The chip count" in str(caught.value)


def test_layout_degrees_splits_a_good_count():
    assert form.layout_degrees("FSDP", 16) == {"fsdp": 16}
    assert form.layout_degrees("DP x FSDP", 16) == {"dp": 4, "fsdp": 4}
    with pytest.raises(sizing.SizingError, match="needs a multiple of 8 chips"):
        form.layout_degrees("FSDP x TP", 12)


def test_static_twin_offers_every_choice():
    page = form.static_sizing_explorer()
    data = json.loads(re.search(r"class='bk-data'>(.*?)</script>", page).group(1))
    assert set(data["rest"]) == {"Llama 3 8B", "Llama 3 70B"}
    keys = {
        f"{m}|{hw}|{lay}|{n}"
        for m in ("Llama 3 8B", "Llama 3 70B")
        for hw in ("TPU v5e", "TPU v5p", "TPU v6e", "H100", "H200")
        for lay in form.LAYOUTS
        for n in form.CHIP_COUNTS
    }
    assert set(data["keys"]) == keys
    assert not any("bk-viz bk-error" in view for view in data["views"])


def test_widget_follows_the_choices(monkeypatch):
    monkeypatch.setattr(form, "static_sizing_explorer", lambda: "<p>twin</p>")
    shown = form.sizing_explorer()
    assert shown.static_html == "<p>twin</p>"
    first, second, out = shown.widget.children
    model, chip, layout = first.children
    chips, batch, seq = second.children
    assert "Llama 3 8B on 256 TPU v5e chips, FSDP (fsdp=256)" in out.value
    chip.value = "H100"
    layout.value = "FSDP x TP"
    assert "on 256 H100 chips, FSDP x TP (fsdp=32, tp=8)" in out.value
    batch.value = "100"
    assert "does not split evenly" in out.value
    batch.value = "512"
    seq.value = "8192"
    assert "512 sequences of 8,192 tokens" in out.value
