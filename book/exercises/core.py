"""What every exercise checker shares: the verdict, and the decorator that makes a checker safe.

A checker stops at the first problem by raising ``Wrong``; the ``checker`` decorator turns that,
or any exception from the reader's own code, into a ``Verdict`` with one sentence.
"""

from __future__ import annotations

import functools
import html
import traceback
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Verdict:
    """A checker's answer: whether the exercise is solved, and one sentence why."""

    ok: bool
    message: str

    def _repr_html_(self):
        colour, mark = ("#1e7b34", "✔") if self.ok else ("#a33", "✘")
        return (
            f"<div style='border-left:4px solid {colour};padding:4px 10px;margin:4px 0'>"
            f"<b style='color:{colour}'>{mark}</b> {html.escape(self.message)}</div>"
        )

    def __repr__(self):
        return ("Correct: " if self.ok else "Not yet: ") + self.message


class Wrong(Exception):
    """Raised inside a checker to stop at the first problem with the reader's answer."""


def checker(func):
    """Turn a checker that raises ``Wrong`` into one that always returns a ``Verdict``."""

    @functools.wraps(func)
    def check(*args, **kwargs):
        try:
            return Verdict(True, func(*args, **kwargs))
        except Wrong as wrong:
            return Verdict(False, str(wrong))
        except Exception as err:  # the reader's code failed: say where, briefly
            frame = traceback.extract_tb(err.__traceback__)[-1]
            return Verdict(
                False,
                f"Your code raised {type(err).__name__} ({str(err).splitlines()[0][:120]}) "
                f"at line {frame.lineno}; fix that and check again.",
            )

    return check


def need(condition, message):
    if not condition:
        raise Wrong(message)


def answered(answer, what):
    need(answer is not None and answer is not ..., f"Not answered yet: {what}.")


def line_mesh(axis):
    """The chapters' mesh: the 8 devices along one Explicit axis, equal to the reader's own."""
    import jax
    from jax.sharding import AxisType

    return jax.make_mesh((8,), (axis,), axis_types=(AxisType.Explicit,))


def compile_and_run(fn, *args):
    """The reader's function compiled for ``args``, and its result: ``(out, compiled)``.

    Two refusals of ``shard_map`` are lessons of these chapters, so each gets its own sentence
    instead of JAX's page-long message: ``in_specs`` that differ from how an input is placed
    (on Explicit axes they must agree), and ``check_vma`` refusing an ``out_specs`` of ``P()``
    for a value JAX cannot prove is the same on every device.
    """
    import re

    import jax

    need(callable(fn), f"Not answered yet: pass a function, not a {type(fn).__name__}.")
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    try:
        with jax.default_matmul_precision("highest"):
            compiled = jitted.lower(*args).compile()
    except ValueError as err:
        text = str(err)
        mismatch = re.search(
            r"in_specs passed to shard_map: (P\([^)]*\)) does not match the specs of the "
            r"input: (P\([^)]*\))",
            text,
        )
        if mismatch:
            raise Wrong(
                f"Your shard_map's in_specs say {mismatch.group(1)} for an input placed as "
                f"{mismatch.group(2)}; on Explicit mesh axes the in_specs must be the inputs' "
                "own specs."
            ) from None
        if "statically inferred" not in text:
            raise
        where = re.search(r"(out_specs\S*) is (P\([^)]*\))", text)
        what = f"{where.group(1)}, {where.group(2)}," if where else "out_specs"
        raise Wrong(
            f"JAX refuses your shard_map: {what} promises a value that is the same on every "
            "device, but each device computes its own; combine them with psum or pmean first."
        ) from None
    return compiled(*args), compiled


def fresh_source(folder, num_examples, features, seed):
    """A small data set on disk, unlike the chapter's, whose every read is logged."""
    import book.data

    values = np.random.default_rng(seed).integers(-9, 10, size=(num_examples, features))
    return book.data.write(folder, x=values.astype(np.float32))


def ints(shape, seed):
    """Small integers as float32: every sum is exact, so a parallel result equals NumPy's."""
    return np.random.default_rng(seed).integers(-2, 3, size=shape).astype(np.float32)


def first_sentence(err) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text.split(". ")[0].rstrip(".")[:160]


def spec_text(spec) -> str:
    return "P(" + ", ".join(repr(s) for s in spec) + ")"
