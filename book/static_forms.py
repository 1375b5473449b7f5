"""Kernel-free twins of the forms, for the online book, where no kernel runs.

A form's pure function is pre-rendered for every choice its static twin offers; the page keeps
the results and a few lines of JavaScript show the one matching the selects; the form that
embeds the markup adds the book's stylesheet (``book.display.styled``). ``Form`` pairs the live
widget with that twin: a notebook front end shows the widget, while the book's HTML builder,
told to skip widget views, shows the twin.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import uuid
from collections.abc import Callable, Sequence

from book import validate
from book.errors import ReaderError

_SCRIPT = r"""<script>(function () {
  var root = document.currentScript.parentElement;
  var data = JSON.parse(root.querySelector("script.bk-data").textContent);
  var selects = root.querySelectorAll("select");
  var out = root.querySelector(".bk-out");
  function fill(select, options) {
    var keep = select.value;
    select.innerHTML = "";
    options.forEach(function (o) { select.add(new Option(o, o)); });
    select.value = options.indexOf(keep) >= 0 ? keep : options[0];
  }
  function show() {
    var key = Array.prototype.map.call(selects, function (s) {
      return s.value.replace(/\\/g, "\\\\").replace(/\|/g, "\\|");
    }).join("|");
    out.innerHTML = data.views[data.keys[key]];
  }
  function follow() {
    var rest = data.rest[selects[0].value];
    for (var i = 1; i < selects.length; i++) { fill(selects[i], rest[i - 1]); }
    show();
  }
  selects[0].addEventListener("change", follow);
  for (var i = 1; i < selects.length; i++) { selects[i].addEventListener("change", show); }
  follow();
})();</script>"""


class Form:
    """A live ipywidgets form for a kernel, with a pre-rendered static twin for the book."""

    def __init__(self, widget, static_html: str):
        self.widget = widget
        self.static_html = static_html

    def _repr_mimebundle_(self, include=None, exclude=None):
        """The widget's view for a kernel, the static twin for a page without one.

        The view is written out rather than taken from the widget: ipywidgets 7 widgets have no
        ``_repr_mimebundle_`` (they display themselves), while 7 and 8 read this same view.
        """
        view = {"version_major": 2, "version_minor": 0, "model_id": self.widget.model_id}
        return {
            "text/plain": repr(self.widget),
            "text/html": self.static_html,
            "application/vnd.jupyter.widget-view+json": view,
        }


def static_form(
    first: tuple[str, Sequence[str]],
    rest: Callable[[str], Sequence[tuple[str, Sequence[str]]]],
    render: Callable[..., str],
    note: str = "",
) -> str:
    """HTML selects plus every rendering they can ask for, switched by JavaScript.

    ``first`` is (label, options) of the control that decides what the others offer;
    ``rest(value)`` gives the other controls' (label, options) for one value of the first, in
    the order ``render`` takes them after it. Identical renderings are stored once.
    """
    for name, given in (("rest", rest), ("render", render)):
        if not callable(given):
            raise ReaderError(f"{name} must be a function, not {validate.describe(given)}.")
    if not isinstance(note, str):
        raise ReaderError(f"note must be a text, not {validate.describe(note)}.")
    label, options = _control(first, "first")  # at most MAX_VIEWS options, as below
    if not options:
        raise ReaderError(f"The control {label!r} has no options; give it at least one.")
    views, index, keys, rest_options = [], {}, {}, {}
    rest_labels = None
    for value in options:
        given = rest(value)
        if not isinstance(given, (list, tuple)):
            raise ReaderError(
                f"rest({value!r}) gave {validate.describe(given)}; return a list of (label, "
                "options) pairs."
            )
        controls = [_control(c, f"A control of rest({value!r})") for c in given]
        labels = [name for name, _ in controls]
        if rest_labels is not None and labels != rest_labels:
            raise ReaderError(
                f"rest gives {value!r} the controls {labels}, and {options[0]!r} {rest_labels}; "
                "the page has one set of controls: give every value the same labels."
            )
        rest_labels = labels
        rest_options[value] = [opts for _, opts in controls]
        combos = math.prod(len(opts) for opts in rest_options[value]) * len(options)
        if combos > MAX_VIEWS:
            raise ReaderError(
                f"The controls make {combos:,} combinations to render; a page can hold at most "
                f"{MAX_VIEWS:,}: offer fewer options."
            )
        if not all(rest_options[value]):
            raise ReaderError(f"rest gives {value!r} a control with no options; give each one.")
        for combo in itertools.product(*rest_options[value]):
            shown = render(value, *combo)
            if not isinstance(shown, str):
                raise ReaderError(
                    f"render gave {validate.describe(shown)} for {(value, *combo)}; return "
                    "the view's HTML as a text."
                )
            if shown not in index:
                index[shown] = len(views)
                views.append(shown)
            keys[_key((value, *combo))] = index[shown]
    data = json.dumps({"views": views, "keys": keys, "rest": rest_options})
    selects = [_select(label, options)] + [_select(name, []) for name in rest_labels or []]
    note_html = f"<div class='bk-note'>{html.escape(note)}</div>" if note else ""
    return (
        f"<div class='bk-form' id='bk-form-{uuid.uuid4().hex[:8]}'>{note_html}"
        f"<div>{''.join(selects)}</div><div class='bk-out'></div>"
        f"<script type='application/json' class='bk-data'>{_safe_json(data)}</script>"
        f"{_SCRIPT}</div>"
    )


MAX_VIEWS = 10_000  # renderings one page holds: past it, a page too large to load


def _control(control, what: str) -> tuple[str, list[str]]:
    """A control as (label, options), its options as text, as a select's values are."""
    if (
        not isinstance(control, (list, tuple))
        or len(control) != 2
        or not isinstance(control[0], str)
        or not isinstance(control[1], (list, tuple, range))
    ):
        raise ReaderError(
            f"{what} must be a (label, options) pair such as ('mesh', ['2x4', '8']), not "
            f"{validate.describe(control)}."
        )
    if len(control[1]) > MAX_VIEWS:
        raise ReaderError(
            f"{what} has {len(control[1]):,} options; a page can hold at most {MAX_VIEWS:,}."
        )
    return control[0], [str(o) for o in control[1]]


def _key(values) -> str:
    """The choices as one text, as the page's script builds it: "|" between them, and a
    backslash before each "|" or backslash they hold, so that no two choices share a key."""
    return "|".join(v.replace("\\", "\\\\").replace("|", "\\|") for v in values)


def _select(label: str, options: Sequence[str]) -> str:
    items = "".join(
        f"<option value='{html.escape(o, quote=True)}'>{html.escape(o)}</option>" for o in options
    )
    return f"<label>{html.escape(label)}<select>{items}</select></label>"


def _safe_json(text: str) -> str:
    """JSON that cannot close its own <script> element."""
    return text.replace("</", "<\\/")
