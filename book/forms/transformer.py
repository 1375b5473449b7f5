"""The layout form (chapter 13): what a rules table makes each device hold and send.

A reader picks one of the chapter's rules tables and a mesh shape; ``book.layouts`` compiles
the chapter's step for that layout and reads what each device holds, the step's memory and its
collectives; ``render_transformer`` shows them as tables. The static twin pre-renders every
table on every mesh of 8 devices it fits, reusing the steps the chapter compiled.
"""

from __future__ import annotations

import html
import math

from book import display, specs, static_forms, validate
from book.forms.common import choice_then_mesh, first_sentence

EXPLAINED = {
    "DP": "The batch split over data, every parameter whole on every device.",
    "FSDP": "The batch and the parameters' embed dimension split over fsdp: weights are "
    "gathered where they are used.",
    "TP": "Heads, MLP units and vocabulary split over model, the batch whole: the stream is "
    "all-reduced after each sublayer.",
    "FSDP x TP": "FSDP over fsdp and TP over model, on two mesh axes.",
    "DP x FSDP x TP": "The batch over data and fsdp, embed over fsdp, heads, MLP units and "
    "vocabulary over model.",
    "TP + SP": "TP, with the stream between sublayers split by its sequence over model.",
}
MESH_SHAPES = ("8", "4x2", "2x4", "2x2x2")  # 1D, 2D and 3D meshes of 8 devices


@validate.impostors_refused
def mesh_choices(table: str) -> list[str]:
    """The 8-device mesh shapes a table fits: one size per mesh axis it names."""
    from book import layouts

    table = validate.choice(table, list(layouts.TABLES), "a rules table", error=specs.SpecError)
    rank = len(layouts.mesh_axes(layouts.TABLES[table]))
    return [m for m in MESH_SHAPES if len(specs.parse_mesh_shape(m)) == rank]


@validate.impostors_refused
def check_transformer(rules, mesh_shape, batch=None, seq=None):
    """The ``book.layouts.Choice`` for what a reader picked or wrote, or ``SpecError``."""
    from book import layouts

    sizes = (layouts.BATCH if batch is None else batch, layouts.SEQ if seq is None else seq)
    return layouts.check(rules, mesh_shape, *sizes)


@validate.impostors_refused
def render_transformer(rules, mesh_shape, batch=None, seq=None) -> str:
    """HTML for one choice of the transformer form: what a step costs each device.

    ``rules`` is a name of ``book.layouts.TABLES`` or a dict from logical names to mesh
    axes, ``mesh_shape`` the text a reader types (``"8"``, ``"4x2"``). A bad choice gives its
    one sentence.
    """
    from book import layouts

    typed = (layouts.BATCH if batch is None else batch, layouts.SEQ if seq is None else seq)
    return display.styled(_answer(rules, mesh_shape, *typed))


def _answer(*typed) -> str:
    """The bare markup for what a reader picked: one step's costs, or why not."""
    from book import layouts

    try:
        analysis = layouts.analyze(*typed)
    except specs.SpecError as err:
        return display.error_html(str(err))
    except Exception as err:  # a compiler failure is shown, not raised, like any bad choice
        return display.error_html(f"The compiler could not build this step: {first_sentence(err)}.")
    return _body(analysis)


def _body(a) -> str:
    from book import cost
    from book.layouts import CONFIG

    c = a.choice
    explained = EXPLAINED.get(c.name, "")
    head = (
        f"<div class='bk-viz'><b>{html.escape(c.name)} on {html.escape(c.where)}</b>: "
        f"rules {html.escape(str(dict(c.rules)))}; a batch of {c.batch} "
        f"sequences of {c.seq} tokens, {CONFIG.n_layers} layers, d_model {CONFIG.d_model}. "
        f"{html.escape(explained)}</div>"
    )
    model_bytes = sum(math.prod(p[1]) * 4 for p in a.params)
    param_table = display.table(
        ["parameter", "shape", "spec", "shard shape", "bytes per device"],
        [[p[0], str(p[1]), p[2], str(p[3]), p[4]] for p in a.params]
        + [["total", "", "", "", a.param_bytes]],
        title=f"Parameters on each device: {a.param_bytes:,} of the model's {model_bytes:,} "
        f"bytes ({a.param_bytes / model_bytes:.1%})",
    )
    memory_table = display.table(
        ["arguments", "outputs", "temporaries", "total"],
        [[a.argument_bytes, a.output_bytes, a.temp_bytes, a.total_bytes]],
        title="Bytes per device of one step, from compiled.memory_analysis()",
    )
    if a.collectives:
        kinds: dict = {}  # (op, mesh axes, runs per step) -> [how many, bytes sent per step]
        for r, axes, runs in a.collectives:
            axes = "device pairs" if r.op == "collective-permute" else axes
            entry = kinds.setdefault((r.op, axes, runs), [0, 0.0])
            entry[0] += 1
            entry[1] += runs * cost.ring_bytes(r)
        rows = [
            [op, axes, count, "per layer" if runs > 1 else "once", round(sent)]
            for (op, axes, runs), (count, sent) in kinds.items()
        ]
        total = round(sum(sent for _, sent in kinds.values()))
        rows.append(["total", "", sum(count for count, _ in kinds.values()), "", total])
        comm = display.table(
            ["collective", "mesh axes", "how many", "runs", "bytes sent per step (ring)"],
            rows,
            title=f"Collectives of one step, from the compiled HLO: those in the loops over "
            f"layers run once per layer, {CONFIG.n_layers} times",
        ).html
    else:
        comm = "<p class='bk-table'>No collectives: every device works on what it holds.</p>"
    return f"{head}{param_table.html}{memory_table.html}{comm}"


def static_transformer_explorer() -> str:
    """The form without a kernel: every table on every 8-device mesh it fits, pre-rendered."""
    from book.layouts import BATCH, SEQ, TABLES

    return display.styled(
        static_forms.static_form(
            ("rules", list(TABLES)),
            lambda table: [("mesh shape", mesh_choices(table))],
            lambda table, mesh_text: _answer(table, mesh_text),
            note=f"The chapter's model, a batch of {BATCH} sequences of {SEQ} tokens. Run the "
            "notebook to call render_transformer with rules of your own.",
        )
    )


@validate.impostors_refused
def transformer_explorer(programs: dict | None = None) -> static_forms.Form:
    """The transformer form: pick a rules table and a mesh; see one step's costs.

    ``programs`` are steps the chapter compiled already (see ``book.layouts.remember``), so
    that neither the twin nor the widget compiles them again. A kernel shows the live widget;
    the online book shows the pre-rendered twin.
    """
    from book import layouts

    layouts.remember({} if programs is None else programs)
    return static_forms.Form(_widget(), static_transformer_explorer())


def _widget():
    """The live ipywidgets form around ``render_transformer``: each step compiles once."""
    from book.layouts import TABLES

    return choice_then_mesh("rules", list(TABLES), mesh_choices, render_transformer)
