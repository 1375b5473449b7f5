"""The strategy form (chapter 09): what one training step of each Part III strategy costs.

For the mesh a reader picks, ``book.strategies.analyze`` compiles the step and reads its
per-device parameters, memory and collectives; ``render_strategy`` shows them as tables. The
static twin pre-renders every strategy and mesh for the online book.
"""

from __future__ import annotations

import html
import math

from book import display, specs, static_forms, validate
from book.forms.common import choice_then_mesh, device_count_for, first_sentence

STRATEGY_EXPLAINED = {
    "DP": "Parameters replicated, batch split over data: one all-reduce averages the gradients.",
    "FSDP": "Parameters and batch split over data: each weight is all-gathered before use, and "
    "the gradients come back reduce-scattered.",
    "TP": "w1 split by columns and w2 by rows over model, batch replicated: only the logits "
    "cross devices, in one all-reduce.",
    "DP x TP": "Batch split over data, weights over model as in TP: the logits are all-reduced "
    "within each model group and the gradients across the data groups.",
}


@validate.impostors_refused
def strategy_mesh_choices(strategy: str, device_count: int) -> list[str]:
    """Mesh shapes the strategy form offers: axis sizes ..., 4, 2 that fit the devices.

    One axis for DP, FSDP and TP; for DP x TP, every ``data x model`` split of all devices
    with both axes at least 2. The largest mesh comes first, so it is what a form shows first.
    """
    strategy = validate.choice(
        strategy, list(STRATEGY_EXPLAINED), "a strategy", error=specs.SpecError
    )
    device_count = validate.whole(
        device_count, "The device count", high=validate.MAX_DEVICES, error=specs.SpecError
    )
    sizes = [2**k for k in range(device_count.bit_length() - 1, 0, -1)]
    if strategy == "DP x TP":
        return [f"{a}x{device_count // a}" for a in sizes if 2 <= device_count // a]
    return [str(k) for k in sizes]


@validate.impostors_refused
def check_strategy(strategy, mesh_shape, batch, features, hidden, classes):
    """The ``book.strategies.Choice`` for what a reader picked and typed, or ``SpecError``."""
    from book import strategies

    return strategies.check(strategy, mesh_shape, (batch, features, hidden, classes))


@validate.impostors_refused
def render_strategy(
    strategy: str,
    mesh_shape: str,
    batch=None,
    features=None,
    hidden=None,
    classes=None,
) -> str:
    """HTML for one choice in the strategy form: what one training step costs each device.

    ``strategy`` is one of ``book.strategies.STRATEGIES``, ``mesh_shape`` the text a reader
    types (``"8"``, ``"4x2"``). The step is compiled once per choice and cached, so going back
    to an earlier choice is immediate. Sizes left out are the chapters' (``strategies.SIZES``).
    A bad choice gives its one-sentence explanation.
    """
    from book import strategies

    typed = [
        v if v is not None else d
        for v, d in zip((batch, features, hidden, classes), strategies.SIZES)
    ]
    return display.styled(_answer(strategy, mesh_shape, *typed))


def _answer(*typed) -> str:
    """The bare markup for what a reader picked: one step's costs, or why not."""
    from book import strategies

    try:
        c = check_strategy(*typed)
    except specs.SpecError as err:
        return display.error_html(str(err))
    try:
        analysis = strategies.analyze(c.strategy, c.mesh_shape, c.sizes)
    except Exception as err:  # a compiler failure is shown, not raised, like any bad choice
        return display.error_html(f"The compiler could not build this step: {first_sentence(err)}.")
    return _body(analysis)


def _body(a) -> str:
    from book import cost, strategies

    axes = ", ".join(
        f"{name}={size}" for name, size in zip(strategies.AXES[a.strategy], a.mesh_shape)
    )
    s = a.sizes
    head = (
        f"<div class='bk-viz'><b>{html.escape(a.strategy)} on "
        f"{display.mesh_text(a.mesh_shape)} ({html.escape(axes)})</b>: batch {s.batch}, "
        f"MLP {s.features} → {s.hidden} → {s.classes}. "
        f"{html.escape(STRATEGY_EXPLAINED[a.strategy])}</div>"
    )
    model_bytes = sum(math.prod(shape) * 4 for shape, *_ in a.param_shards.values())
    params = [
        [name, str(shape), specs.spec_text(spec), str(shard), nbytes]
        for name, (shape, spec, shard, nbytes) in a.param_shards.items()
    ]
    params.append(["total", "", "", "", a.param_bytes])
    param_table = display.table(
        ["parameter", "shape", "spec", "shard shape", "bytes per device"],
        params,
        title=f"Parameters on each device: {a.param_bytes:,} of the model's {model_bytes:,} "
        f"bytes ({a.param_bytes / model_bytes:.1%})",
    )
    memory_table = display.table(
        ["arguments", "outputs", "temporaries", "total"],
        [
            [
                a.argument_bytes,
                a.output_bytes,
                a.temp_bytes,
                a.argument_bytes + a.output_bytes + a.temp_bytes,
            ]
        ],
        title="Bytes per device of one step, from compiled.memory_analysis()",
    )
    if a.collectives:
        rows = [
            [k, r.op, display.shape_text(r), r.group_size, r.bytes, round(cost.ring_bytes(r))]
            for k, r in enumerate(a.collectives)
        ]
        rows.append(["", "total", "", "", sum(r.bytes for r in a.collectives), round(a.sent_bytes)])
        comm = display.table(
            [
                "#",
                "collective",
                "shape per device",
                "group size",
                "result bytes",
                "bytes sent (ring)",
            ],
            rows,
            title="Collectives of one step (from the compiled HLO)",
        ).html
    else:
        comm = "<p class='bk-table'>No collectives: every device works on what it holds.</p>"
    return f"{head}{param_table.html}{memory_table.html}{comm}"


def static_strategy_explorer() -> str:
    """The strategy form without a kernel: every strategy and mesh choice pre-rendered."""

    from book import strategies

    count = device_count_for("strategy form")
    s = strategies.SIZES
    return display.styled(
        static_forms.static_form(
            ("strategy", _offered(count)),
            lambda strategy: [("mesh shape", strategy_mesh_choices(strategy, count))],
            lambda strategy, mesh: _answer(strategy, mesh, *s),
            note=f"Model sizes: batch {s.batch}, MLP {s.features} → {s.hidden} → {s.classes}. "
            "Run the notebook to change them.",
        )
    )


def _offered(count: int) -> list[str]:
    """The strategies these devices can lay out: DP x TP needs 2 on each of its axes."""
    return [s for s in STRATEGY_EXPLAINED if strategy_mesh_choices(s, count)]


def strategy_explorer() -> static_forms.Form:
    """The strategy form: pick a strategy, a mesh shape and sizes; see one step's costs.

    A kernel shows the live widget; the online book shows the pre-rendered twin.
    """
    return static_forms.Form(_widget(), static_strategy_explorer())


def _widget():
    """The live ipywidgets form around ``render_strategy``.

    It offers the strategies and meshes for the chapter's model: each such step compiles once
    and is cached, so every change answers at once. Other model sizes are for code cells
    (``render_strategy(..., batch=...)``), where waiting for a compile is expected.
    """

    count = device_count_for("strategy form")
    return choice_then_mesh(
        "strategy",
        _offered(count),
        lambda strategy: strategy_mesh_choices(strategy, count),
        render_strategy,
    )
