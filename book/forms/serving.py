"""The serving form (chapter 20): memory per chip and a decode step's bound for a published model.

A reader picks a model, a chip, a layout, how many chips and a batch; ``render_serving`` shows
what ``book.sizing.serve`` counts for them at 4,096 cached tokens a sequence, and the bound
``ServePlan.decode_seconds`` gives on that chip. Nothing is compiled, so the static twin
pre-renders every choice for the online book.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from book import display, sizing, static_forms, validate
from book.forms import common

CONTEXT = 4096
CHIP_COUNTS = ("1", "2", "4", "8", "16", "32")
BATCHES = ("1", "8", "32", "128")
LAYOUTS = {  # name -> how it splits the chips
    "TP": "tp over all chips (at most the model's 8 K/V heads)",
    "DP x TP": "tp=8 (or all chips, if fewer), dp over the rest",
    "CP x TP": "tp=8 (or all chips, if fewer), cp (the cache's positions) over the rest",
    "FSDP": "fsdp over all chips",
}
_GIB = 2**30


@validate.impostors_refused
def layout_degrees(layout: str, chips: int) -> dict:
    """The ``serve`` keywords of a named layout on ``chips`` chips."""
    layout = validate.choice(layout, list(LAYOUTS), "a layout", error=sizing.SizingError)
    chips = validate.whole(
        chips, "The chip count", high=validate.MAX_DEVICES, text=True, error=sizing.SizingError
    )
    tp = min(chips, 8)
    if layout in ("DP x TP", "CP x TP") and chips % tp:
        raise sizing.SizingError(
            f"{layout} needs a multiple of 8 chips above 8, not {chips}; choose another count."
        )
    return {
        "TP": {"tp": chips},
        "DP x TP": {"tp": tp, "dp": chips // tp},
        "CP x TP": {"tp": tp, "cp": chips // tp},
        "FSDP": {"fsdp": chips},
    }[layout]


@dataclass(frozen=True)
class Choice:
    """One valid choice of the form."""

    model: str
    hardware: str
    layout: str
    chips: int
    degrees: tuple
    batch: int


@validate.impostors_refused
def check_serving(model, hardware, layout, chips, batch) -> Choice:
    """The ``Choice`` for what a reader picked, or ``SizingError`` in one sentence."""
    error = sizing.SizingError
    model = validate.choice(model, list(sizing.PRESETS), "a model", error=error)
    hardware = validate.choice(hardware, list(sizing.HARDWARE), "a chip", error=error)
    degrees = layout_degrees(layout, chips)
    batch = validate.whole(batch, "The batch", text=True, example=32, error=error)
    chips = math.prod(degrees.values())  # the count as checked, not int() of what was typed
    return Choice(model, hardware, layout, chips, tuple(degrees.items()), batch)


@validate.impostors_refused
def render_serving(model: str, hardware: str, layout: str, chips, batch) -> str:
    """HTML for one choice: memory per chip against its HBM, and the decode step's bound."""
    return display.styled(_answer(model, hardware, layout, chips, batch))


def _answer(*typed) -> str:
    try:
        c = check_serving(*typed)
        p = sizing.serve(sizing.PRESETS[c.model], batch=c.batch, context=CONTEXT, **dict(c.degrees))
    except sizing.SizingError as err:
        return display.error_html(str(err))
    return _body(c, p, sizing.HARDWARE[c.hardware])


def _body(c: Choice, p: sizing.ServePlan, hw: sizing.Hardware) -> str:
    s = p.decode_seconds(hw)
    degrees = ", ".join(f"{k}={v}" for k, v in c.degrees)
    sequences = f"{c.batch:,} sequence{'s' if c.batch != 1 else ''}"
    fits = p.memory["total"] <= hw.hbm_bytes
    head = (
        f"<div class='bk-viz'><b>{html.escape(c.model)} on {c.chips} {html.escape(hw.name)}, "
        f"{html.escape(c.layout)} ({html.escape(degrees)})</b>: {sequences} of "
        f"{CONTEXT:,} cached tokens, bfloat16. Weights and cache "
        f"{'fit' if fits else 'do not fit'} in its {hw.hbm_bytes / 1e9:.0f} GB of HBM (all of "
        "it: no working memory or headroom counted).</div>"
    )
    memory = display.table(
        ["weights", "cache", "total", "HBM"],
        [
            [f"{p.memory[k] / _GIB:.1f}" for k in ("params", "cache", "total")]
            + [f"{hw.hbm_bytes / _GIB:.1f}"]
        ],
        title="GiB per chip (book.sizing.serve)",
    )
    comm = max(s.comm.values())
    times = display.table(
        [
            "compute",
            "memory",
            "communication",
            "bound",
            "serial",
            "tokens/s per user",
            "per chip",
        ],
        [
            [
                f"{1e3 * s.compute:.2f}",
                f"{1e3 * s.memory:.2f}",
                f"{1e3 * comm:.2f}",
                f"{1e3 * s.bound:.2f}",
                f"{1e3 * s.serial:.2f}",
                f"{s.per_user:,.0f}",
                f"{s.per_chip:,.0f}",
            ]
        ],
        title="Milliseconds per decode step at peak FLOP/s and bandwidths (published figures): "
        "bound overlaps communication, serial adds it; tokens/s at the bound",
    )
    return head + memory.html + times.html


def static_serving_explorer() -> str:
    """The serving form without a kernel: every choice pre-rendered."""
    return display.styled(
        static_forms.static_form(
            ("model", list(sizing.PRESETS)),
            lambda _: [
                ("chip", list(sizing.HARDWARE)),
                ("layout", list(LAYOUTS)),
                ("chips", list(CHIP_COUNTS)),
                ("batch", list(BATCHES)),
            ],
            _answer,
            note=f"{CONTEXT:,} cached tokens a sequence, bfloat16 weights and cache.",
        )
    )


def serving_explorer() -> static_forms.Form:
    """The serving form: a kernel shows the live widget, the online book its static twin."""
    return static_forms.Form(_widget(), static_serving_explorer())


def _widget():
    """The live ipywidgets form around ``render_serving``: every change answers at once."""
    import ipywidgets as w

    boxes = common.planner_boxes(LAYOUTS, CHIP_COUNTS, "8")
    boxes["batch"] = w.Text(value="32", description="batch")
    return common.live(boxes, render_serving)
