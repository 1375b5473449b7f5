"""Interactive forms: thin ipywidgets wiring around pure functions that return HTML.

One module per form: ``sharding`` (chapter 02), ``collective`` (chapter 05), ``strategy``
(chapter 09), ``transformer`` (chapter 13) and ``sizing`` (chapter 18). Each has a frozen
``Choice`` that its ``check`` builds from exactly what a reader types or picks, a ``render_*``
function that shows one choice, a static twin that pre-renders every choice for the online
book, and the live widget. A bad choice comes back as HTML holding one sentence saying what to
change: these functions never raise for a reader's input, so tests call them directly. The
names below are what chapters call.
"""

from book.forms.collective import (
    COLLECTIVES,
    block_values,
    collective_explorer,
    parse_perm,
    render_collective,
    static_collective_explorer,
)
from book.forms.common import mesh_shapes
from book.forms.sharding import (
    render_sharding,
    sharding_explorer,
    spec_choices,
    static_sharding_explorer,
)
from book.forms.sizing import (
    check_sizing,
    render_sizing,
    sizing_explorer,
    static_sizing_explorer,
)
from book.forms.strategy import (
    STRATEGY_EXPLAINED,
    check_strategy,
    render_strategy,
    static_strategy_explorer,
    strategy_explorer,
    strategy_mesh_choices,
)
from book.forms.transformer import (
    check_transformer,
    render_transformer,
    static_transformer_explorer,
    transformer_explorer,
)

__all__ = [
    "COLLECTIVES",
    "STRATEGY_EXPLAINED",
    "block_values",
    "check_sizing",
    "check_strategy",
    "check_transformer",
    "collective_explorer",
    "mesh_shapes",
    "parse_perm",
    "render_collective",
    "render_sharding",
    "render_sizing",
    "render_strategy",
    "render_transformer",
    "sharding_explorer",
    "sizing_explorer",
    "spec_choices",
    "static_collective_explorer",
    "static_sharding_explorer",
    "static_sizing_explorer",
    "static_strategy_explorer",
    "static_transformer_explorer",
    "strategy_explorer",
    "strategy_mesh_choices",
    "transformer_explorer",
]
