"""The sizing form (chapter 18): memory per device and a step's bound for a published model.

A reader picks a model, a chip, a layout and how many chips, and types a batch and a sequence
length; ``render_sizing`` shows what ``book.sizing.plan`` counts for them and the bound
``Plan.seconds`` gives on that chip. Nothing is compiled, so the static twin pre-renders every
model, chip, layout and chip count for the online book at the default batch.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from book import display, sizing, static_forms, validate
from book.forms import common

SIZING_DEFAULTS = {"global_batch": 1024, "seq": 4096}
CHIP_COUNTS = ("128", "256", "512", "1024")
LAYOUTS = {  # name -> (how it splits the chips, keyword arguments beside the degrees)
    "FSDP": "fsdp over all chips",
    "DP x FSDP": "dp=4 (four slices or groups), fsdp over the rest",
    "FSDP x TP": "tp=8 (one TP group per 8 chips), fsdp over the rest",
    "FSDP x TP, SP": "as FSDP x TP, with sequence parallelism",
    "FSDP x TP x PP": "pp=4 stages of tp=8, fsdp over the rest, 8 microbatches",
}
_GIB = 2**30
_DEFAULTS = tuple(SIZING_DEFAULTS.values())


@validate.impostors_refused
def layout_degrees(layout: str, chips: int) -> dict:
    """The ``plan`` keywords of a named layout on ``chips`` chips."""
    layout = validate.choice(layout, list(LAYOUTS), "a layout", error=sizing.SizingError)
    chips = _chip_count(chips)
    inner = {"FSDP": 1, "DP x FSDP": 4, "FSDP x TP": 8, "FSDP x TP, SP": 8, "FSDP x TP x PP": 32}
    if chips % inner[layout]:
        raise sizing.SizingError(
            f"{layout} needs a multiple of {inner[layout]} chips, not {chips}; choose another "
            "chip count."
        )
    rest = chips // inner[layout]
    return {
        "FSDP": {"fsdp": rest},
        "DP x FSDP": {"dp": 4, "fsdp": rest},
        "FSDP x TP": {"fsdp": rest, "tp": 8},
        "FSDP x TP, SP": {"fsdp": rest, "tp": 8, "sequence_parallel": True},
        "FSDP x TP x PP": {"fsdp": rest, "tp": 8, "pp": 4, "microbatches": 8},
    }[layout]


def _chip_count(chips, text: bool = False) -> int:
    """A number of chips, 1 to ``validate.MAX_DEVICES``; with ``text``, as a form types it."""
    return validate.whole(
        chips, "The chip count", high=validate.MAX_DEVICES, text=text, error=sizing.SizingError
    )


@dataclass(frozen=True)
class Choice:
    """One valid choice of the form: a model, a chip, a layout's keywords, batch and length."""

    model: str
    hardware: str
    layout: str
    chips: int
    degrees: tuple
    global_batch: int
    seq: int


@validate.impostors_refused
def check_sizing(model, hardware, layout, chips, global_batch, seq) -> Choice:
    """The ``Choice`` for what a reader picked and typed, or ``SizingError`` in one sentence."""
    error = sizing.SizingError
    model = validate.choice(model, list(sizing.PRESETS), "a model", error=error)
    hardware = validate.choice(hardware, list(sizing.HARDWARE), "a chip", error=error)
    chips = _chip_count(chips, text=True)
    degrees = layout_degrees(layout, chips)
    batch = validate.whole(global_batch, "The global batch", text=True, example=1024, error=error)
    # From a sequence short enough that latency swamps the step to Llama 3.1's 128K window.
    seq = validate.whole(
        seq,
        "The sequence length",
        low=128,
        high=131072,
        text=True,
        example=4096,
        too_large="longer than Llama 3.1's context window",
        error=error,
    )
    return Choice(model, hardware, layout, chips, tuple(degrees.items()), batch, seq)


@validate.impostors_refused
def render_sizing(
    model: str,
    hardware: str,
    layout: str,
    chips,
    global_batch=SIZING_DEFAULTS["global_batch"],
    seq=SIZING_DEFAULTS["seq"],
) -> str:
    """HTML for one choice: memory per device against the chip's, and the step's bound."""
    return display.styled(_answer(model, hardware, layout, chips, global_batch, seq))


def _answer(*typed) -> str:
    try:
        c = check_sizing(*typed)
        p = sizing.plan(
            sizing.PRESETS[c.model], global_batch=c.global_batch, seq=c.seq, **dict(c.degrees)
        )
    except sizing.SizingError as err:
        return display.error_html(str(err))
    return _body(c, p, sizing.HARDWARE[c.hardware])


def _body(c: Choice, p: sizing.Plan, hw: sizing.Hardware) -> str:
    s = p.seconds(hw)
    degrees = ", ".join(f"{k}={v}" for k, v in c.degrees if k in sizing.KINDS)
    fits = p.memory["total"] <= hw.hbm_bytes
    head = (
        f"<div class='bk-viz'><b>{html.escape(c.model)} on {c.chips:,} {html.escape(hw.name)} "
        f"chips, {html.escape(c.layout)} ({html.escape(degrees)})</b>: {c.global_batch:,} "
        f"sequences of {c.seq:,} tokens per step. "
        f"The counted state and activations {'fit' if fits else 'do not fit'} in its "
        f"{hw.hbm_bytes / 1e9:.0f} GB of HBM ({hw.hbm_bytes / _GIB:.1f} GiB); temporaries "
        "such as gathered weights and the float32 logits are not counted.</div>"
    )
    memory = display.table(
        ["params", "grads", "optimizer", "activations", "total", "HBM"],
        [[f"{p.memory[k] / _GIB:.1f}" for k in (*p.memory,)] + [f"{hw.hbm_bytes / _GIB:.1f}"]],
        title="GiB per device (book.sizing.plan)",
    )
    kinds = [k for k in sizing.KINDS if k not in ("cp", "ep")]  # not among the form's axes
    comm = [f"{s.comm[k]:.2f} ({s.links[k]})" if p.layout[k] > 1 else "" for k in kinds]
    tokens = c.global_batch * c.seq / (c.chips * s.bound)
    times = display.table(
        ["compute", *kinds, "bound", "MFU at most", "tokens/s per chip"],
        [[f"{s.compute:.2f}", *comm, f"{s.bound:.2f}", f"{s.mfu:.0%}", f"{tokens:,.0f}"]],
        title="Seconds per step at peak FLOP/s and link bandwidth (published figures)",
    )
    return head + memory.html + times.html


def static_sizing_explorer() -> str:
    """The sizing form without a kernel: every model, chip, layout and count pre-rendered."""
    return display.styled(
        static_forms.static_form(
            ("model", list(sizing.PRESETS)),
            lambda _: [
                ("chip", list(sizing.HARDWARE)),
                ("layout", list(LAYOUTS)),
                ("chips", list(CHIP_COUNTS)),
            ],
            lambda model, hw, layout, chips: _answer(model, hw, layout, chips, *_DEFAULTS),
            note="1,024 sequences of 4,096 tokens per step. Run the notebook to change them.",
        )
    )


def sizing_explorer() -> static_forms.Form:
    """The sizing form: a kernel shows the live widget, the online book its static twin."""
    return static_forms.Form(_widget(), static_sizing_explorer())


def _widget():
    """The live ipywidgets form around ``render_sizing``: every change answers at once."""
    import ipywidgets as w

    boxes = common.planner_boxes(LAYOUTS, CHIP_COUNTS, "256")
    boxes["global_batch"] = w.Text(value=str(SIZING_DEFAULTS["global_batch"]), description="batch")
    boxes["seq"] = w.Text(value=str(SIZING_DEFAULTS["seq"]), description="seq")
    return common.live(boxes, render_sizing)
