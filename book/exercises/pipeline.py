"""Checkers for chapter 14: microbatches for a small bubble, a stage's work, activations held.

Each one measures the answer with the chapter's own schedule rules, exported to
``book.lessons.pipeline`` (``schedule``, ``work``, ``by_stage``, the two orders and
``simulate``), on problems of its own, and answers in one sentence. None compiles anything.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from book import validate
from book.exercises.core import Wrong, answered, checker, function, need, number, numbers

# Exercise 14.1's problem: the chapter's text states these numbers.
BUBBLE_PROBLEM = {"stages": 8, "target": Fraction(1, 10), "circular_groups": 4}
# Exercise 14.3's problem.
IN_FLIGHT_PROBLEM = {"stages": 6, "microbatches": 4}
# Exercise 14.2's problems: (stages, microbatches, groups per stage, layers).
_SCHEDULES = [(4, 4, 1, 8), (4, 6, 2, 16), (8, 8, 2, 16), (3, 5, 3, 18), (2, 3, 1, 2)]


def bubble(p: int, m: int, v: int = 1) -> Fraction:
    """The idle share of stage-steps, counted from the chapter's schedule."""
    from book.lessons import pipeline

    grid = pipeline.schedule(p, m, v)
    return Fraction(int((grid < 0).sum()), grid.size)


def smallest_microbatches(p: int, target: Fraction, v: int = 1) -> int:
    """The fewest microbatches whose bubble is at most ``target`` (at least p when v > 1)."""
    m = 1 if v == 1 else p
    while bubble(p, m, v) > target:
        m += 1
    return m


def _whole(answer, name: str) -> int:
    answered(answer, f"set {name} to a number of microbatches")
    answer = number(answer, name, "a whole number of microbatches")
    need(
        answer == int(answer) and answer >= 1,
        f"{name} = {answer:g} is not a whole, positive number of microbatches; round up.",
    )
    need(
        answer <= 10_000,
        f"{name} = {int(answer):,} is far more microbatches than a bubble of 10% needs.",
    )
    return int(answer)


@checker
def ch14_microbatches(m_gpipe, m_circular):
    """Exercise 14.1: the fewest microbatches for a bubble of at most 10% on 8 stages."""
    p, target, v = (
        BUBBLE_PROBLEM["stages"],
        BUBBLE_PROBLEM["target"],
        BUBBLE_PROBLEM["circular_groups"],
    )
    answers = {"m_gpipe": (m_gpipe, 1), "m_circular": (m_circular, v)}
    for name, (answer, groups) in answers.items():
        m = _whole(answer, name)
        best = smallest_microbatches(p, target, groups)
        kind = "GPipe" if groups == 1 else f"the circular schedule with v = {groups}"
        if groups > 1:
            need(
                m >= p,
                f"{name} = {m} is fewer than the {p} stages; the circular schedule needs "
                "m >= p, so that each microbatch is back at stage 0 for its next trip.",
            )
            need(
                m != smallest_microbatches(p, target),
                f"{name} = {m} is GPipe's answer; with {groups} groups per stage there are "
                f"{groups} m + p - 1 steps, so fewer microbatches do.",
            )
        if m == best:
            continue
        if m < best:
            raise Wrong(
                f"With {name} = {m}, {kind} idles {float(bubble(p, m, groups)):.1%} of the "
                f"time, over 10%; the bubble is (p - 1) / ({'v ' * (groups > 1)}m + p - 1)."
            )
        without_fill = -(-(p - 1) // (target * groups))  # (p - 1) / (v m) <= target
        need(
            m != without_fill,
            f"{name} = {m} keeps (p - 1) / {'(v m)' if groups > 1 else 'm'} at 10%, but "
            f"the pipeline runs {'v ' * (groups > 1)}m + p - 1 steps, so fewer microbatches "
            "do.",
        )
        raise Wrong(
            f"{name} = {m} keeps the bubble at or under 10%, but fewer microbatches do too: "
            f"{kind} with {m - 1} idles {float(bubble(p, m - 1, groups)):.1%}."
        )
    gpipe, circular = int(m_gpipe), int(m_circular)
    return (
        f"{gpipe} microbatches give GPipe a bubble of {float(bubble(p, gpipe)):.1%} on {p} "
        f"stages, and {circular} give the circular schedule "
        f"{float(bubble(p, circular, v)):.1%}, {gpipe / circular:.1f} times fewer."
    )


def _expected(t, s, p, m, v, n_layers):
    """What the chapter's rules say stage s does at step t: None or (microbatch, layers)."""
    from book.lessons import pipeline

    k = int(pipeline.work(t, s, m, v))
    if k < 0:
        return None
    layers = pipeline.by_stage(np.arange(n_layers), p, v)[s, k // m]
    return k % m, [int(i) for i in layers]


def _as_work(answer, where):
    """The reader's (microbatch, layers) as (int, list of ints), or a one-sentence refusal."""
    answer = validate.plain(answer)
    need(
        isinstance(answer, (tuple, list)) and len(answer) == 2,
        f"{where} stage_work returns {type(answer).__name__}; return None or two things, "
        "(microbatch, layers).",
    )
    microbatch, layers = answer
    wanted = f"{where} the microbatch should be a whole number and the layers a list of them"
    microbatch = number(microbatch, f"{where} the microbatch")
    layers = numbers(layers, f"{where} the layers", "[0, 1]").reshape(-1)
    need(
        microbatch == int(microbatch) and (layers == np.round(layers)).all(),
        f"{wanted}, not {validate.describe(answer)}.",
    )
    return int(microbatch), [int(i) for i in layers]


@checker
def ch14_stage_work(stage_work):
    """Exercise 14.2: the microbatch and layers of stage s at step t, any p, m, v."""
    function(stage_work, "stage_work", (0, 0, 1, 1, 1, 1), "(t, s, p, m, v, n_layers)")
    checked = 0
    for p, m, v, n_layers in _SCHEDULES:
        case = f"p = {p}, m = {m}, v = {v}, {n_layers} layers"
        for t in range(v * m + p - 1):
            for s in range(p):
                where = f"At step {t}, stage {s} ({case}):"
                want = _expected(t, s, p, m, v, n_layers)
                got = stage_work(t, s, p, m, v, n_layers)
                need(
                    got is not ...,
                    "Not answered yet: stage_work returns ...; return None or "
                    "(microbatch, layers).",
                )
                if want is None:
                    need(
                        got is None,
                        f"{where} the stage idles (item t - s = {t - s} is outside 0 to "
                        f"v m - 1), so return None.",
                    )
                    continue
                need(
                    got is not None,
                    f"{where} the stage works on item t - s = {t - s}; return "
                    "(microbatch, layers), not None.",
                )
                microbatch, layers = _as_work(got, where)
                checked += 1
                if (microbatch, layers) == want:
                    continue
                k = t - s
                need(
                    microbatch != k // m or k // m == k % m,
                    f"{where} microbatch {microbatch} is the layer group; item k = g m + j "
                    "is microbatch j = k mod m in group g = k // m.",
                )
                need(
                    microbatch == want[0],
                    f"{where} the microbatch is {want[0]}, not {microbatch}.",
                )
                size = n_layers // (p * v)
                run = v * s + k // m  # a stage's groups taken as one contiguous block
                need(
                    layers != list(range(run * size, (run + 1) * size)),
                    f"{where} layers {layers} make stage {s}'s groups consecutive; group g "
                    "of stage s is run number g p + s of the model.",
                )
                raise Wrong(f"{where} the stage applies layers {want[1]}, not {layers}.")
    return (
        f"every stage and step agrees with the chapter's schedule, {checked} working "
        f"stage-steps over {len(_SCHEDULES)} pipelines, GPipe's and circular ones."
    )


def _peaks(answer, name: str, p: int) -> list[int]:
    answered(answer, f"set {name} to a list of {p} numbers, stage 0 first")
    values = numbers(answer, name, f"a list of {p} numbers, stage 0 first").reshape(-1)
    need(
        values.size == p,
        f"{name} has {values.size} number{'s' * (values.size != 1)}; give one per stage, {p}.",
    )
    return [int(x) if float(x).is_integer() else float(x) for x in values]


@checker
def ch14_in_flight(peak_gpipe, peak_1f1b):
    """Exercise 14.3: the most microbatches each stage holds, GPipe and 1F1B."""
    from book.lessons import pipeline

    p, m = IN_FLIGHT_PROBLEM["stages"], IN_FLIGHT_PROBLEM["microbatches"]
    gpipe = _peaks(peak_gpipe, "peak_gpipe", p)
    one_f = _peaks(peak_1f1b, "peak_1f1b", p)
    want = {}
    for name, order in (("GPipe", pipeline.gpipe_order), ("1F1B", pipeline.one_f_one_b_order)):
        run = pipeline.simulate([order(p, m, s) for s in range(p)])
        want[name] = [int(x) for x in pipeline.in_flight(run).max(axis=0)]
    need(
        gpipe != [m + p - 1] * p,
        f"peak_gpipe counts the {m + p - 1} steps of the schedule; a stage holds one set "
        f"of activations per microbatch, and there are {m}.",
    )
    need(
        gpipe == want["GPipe"],
        f"peak_gpipe = {gpipe} is not what GPipe holds: every stage runs all {m} "
        "forwards before its first backward.",
    )
    need(
        one_f != list(range(p, 0, -1)),
        f"peak_1f1b = {one_f} has stage 0 holding {p}, but there are only {m} "
        "microbatches to hold.",
    )
    need(
        one_f != list(range(1, p + 1)) and one_f != [min(s + 1, m) for s in range(p)],
        "peak_1f1b is reversed: the first stage waits longest for its first backward, "
        "so it holds the most.",
    )
    need(
        one_f == want["1F1B"],
        f"peak_1f1b = {one_f} is not what 1F1B holds: stage s runs p - s - 1 forwards "
        "before its first forward-backward pair, and then holds one more.",
    )
    return (
        f"GPipe holds {m} microbatches on every stage; 1F1B holds "
        f"{', '.join(map(str, one_f))}: no saving on the first stages while m < p."
    )
