"""Checkers for chapter 21: when Ulysses beats the ring, and what 1F1B keeps.

Each one judges the reader's answer against ``book.cost``'s formulas or the schedules' counts,
on cases of its own, and answers in one sentence.
"""

from __future__ import annotations

import itertools

import numpy as np

from book.exercises.core import (
    Wrong,
    answered,
    call,
    checker,
    coarse,
    function,
    need,
    number,
    returned,
)
from book.exercises.core import shown as _shown

# Exercise 21.2's problem, as the chapter states it.
PIPELINE = {"stages": 8, "microbatches": 32, "microbatch_bytes": 64 * 2**20}

# (heads, kv_heads, n) cases for exercise 21.1: multi-head, grouped-query, Ulysses impossible.
_HEAD_CASES = list(itertools.product((8, 16, 32, 64), (1, 2, 4, 8, 16, 32, 64), (2, 4, 8, 16)))


def _ulysses_cheaper(heads: int, kv_heads: int, n: int) -> bool:
    """Whether Ulysses can split these heads over ``n`` devices and sends fewer bytes."""
    from book import cost

    if heads % kv_heads or kv_heads % n:
        return False
    sizes = {"tokens": 4096 * n, "kv_heads": kv_heads, "head_dim": 128, "n": n}
    ring = cost.ring_attention_bytes(**sizes, itemsize=2)
    return cost.ulysses_bytes(heads=heads, **sizes, itemsize=2) < ring


def _is_bool(value) -> bool:
    """True or False, as Python, NumPy or a 0-d JAX array of booleans gives it."""
    if np.ma.is_masked(value):  # a masked value holds no answer, whatever lies under it
        return False
    try:
        return np.ndim(value) == 0 and np.asarray(value).dtype == bool
    except Exception:  # noqa: BLE001 - an object whose own methods fail is no boolean
        return False


@checker
def ch21_ulysses_wins(ulysses_wins):
    """Exercise 21.1: when Ulysses sends fewer bytes than the ring, and can run at all."""
    function(ulysses_wins, "ulysses_wins", (8, 8, 2), "(heads, kv_heads, n)")
    cases = [(h, k, n) for h, k, n in _HEAD_CASES if k <= h]
    for heads, kv_heads, n in cases:
        got = call(ulysses_wins, "ulysses_wins", heads, kv_heads, n)
        if not _is_bool(got):
            returned(got, f"ulysses_wins({heads}, {kv_heads}, {n})", "True or False")
        want = _ulysses_cheaper(heads, kv_heads, n)
        if bool(got) == want:
            continue
        case = f"{heads} heads, {kv_heads} K/V head{'s' * (kv_heads > 1)} on {n} devices"
        need(
            not (got and kv_heads % n),
            f"For {case} Ulysses cannot run as the chapter lays it out: each device needs "
            f"whole K/V heads, and {kv_heads} cannot split over {n}.",
        )
        tie = heads + kv_heads == kv_heads * n  # Ulysses' bytes over the ring's: exactly 1
        who = (
            "both send the same bytes"
            if tie
            else f"{'Ulysses' if want else 'the ring'} sends fewer bytes"
        )
        raise Wrong(
            f"For {case} {who}: compare (heads + kv_heads) / (kv_heads * n), Ulysses' bytes "
            "over the ring's, with 1; Ulysses wins only below it."
        )
    wins = sum(_ulysses_cheaper(*case) for case in cases)
    return (
        f"{len(cases)} cases checked; Ulysses wins {wins} of them, never with 8 query heads "
        "per K/V head on 8 or fewer devices."
    )


@checker
def ch21_stash_bytes(gpipe_bytes, one_f_one_b_bytes, bubble):
    """Exercise 21.2: each schedule's stash on its busiest stage, and the bubble they share."""
    p, m, size = PIPELINE["stages"], PIPELINE["microbatches"], PIPELINE["microbatch_bytes"]
    answered(gpipe_bytes, "set gpipe_bytes to the bytes GPipe keeps on its busiest stage")
    gpipe = number(gpipe_bytes, "gpipe_bytes")
    need(
        gpipe == m * size,
        f"Not {_shown(gpipe)} bytes for GPipe: on every stage after the first, each of the "
        f"{m} microbatches' stage inputs waits for its backward.",
    )
    answered(
        one_f_one_b_bytes, "set one_f_one_b_bytes to the bytes 1F1B keeps on its busiest stage"
    )
    ours = number(one_f_one_b_bytes, "one_f_one_b_bytes")
    need(
        ours != (p - 1) * size,
        f"Not {_shown(ours)} bytes: besides stage 1's p - 1 microbatches in flight, one more "
        "can arrive before its forward runs, so the busiest stash holds min(m, p) stage inputs.",
    )
    need(
        ours == min(m, p) * size,
        f"Not {_shown(ours)} bytes for 1F1B: its busiest stash holds min(m, p) stage inputs.",
    )
    answered(bubble, "set bubble to the fraction of a step each stage idles")
    got = number(bubble, "bubble")
    want = (p - 1) / (m + p - 1)
    coarse(bubble, got, want, "bubble", 1e-6)
    need(
        abs(got - want) <= 1e-6,
        f"Not {got:.4g}: in both schedules each stage waits p - 1 of its m + p - 1 "
        "forward slots and as many backward slots.",
    )
    return (
        f"GPipe keeps {m * size / 2**30:g} GiB, 1F1B {min(m, p) * size / 2**30:g} GiB, and "
        f"both idle {want:.1%} of the step."
    )
