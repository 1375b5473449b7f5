"""Chapter 21's checkers: when Ulysses beats the ring, and what each pipeline schedule keeps."""

import numpy as np

from book import cost, exercises
from book.exercises import newer


def judged(verdict, *phrases):
    assert verdict.judged and not verdict.ok, verdict.message
    for phrase in phrases:
        assert phrase in verdict.message, verdict.message


def right_answer(heads, kv_heads, n):
    """The rule the chapter derives: Ulysses needs whole K/V heads and fewer bytes."""
    return heads % kv_heads == 0 and kv_heads % n == 0 and heads + kv_heads < kv_heads * n


def test_the_rule_agrees_with_book_cost_in_every_case():
    for heads, kv_heads, n in newer._HEAD_CASES:
        if kv_heads <= heads:
            assert newer._ulysses_cheaper(heads, kv_heads, n) == right_answer(heads, kv_heads, n)
    assert newer._ulysses_cheaper(8, 8, 8)  # multi-head: Ulysses sends 2/n of the ring's
    assert not newer._ulysses_cheaper(64, 8, 8)  # grouped-query: the ring sends less
    ring = cost.ring_attention_bytes(4096 * 8, 8, 128, 8, itemsize=2)
    assert cost.ulysses_bytes(4096 * 8, 64, 8, 128, 8, itemsize=2) / ring == 9 / 8


def test_ulysses_wins():
    assert exercises.ch21_ulysses_wins(right_answer).ok
    assert exercises.ch21_ulysses_wins(lambda h, k, n: np.bool_(right_answer(h, k, n))).ok
    judged(exercises.ch21_ulysses_wins(None), "Not answered yet")

    def masked(h, k, n):
        return np.ma.array(right_answer(h, k, n), mask=True)

    judged(exercises.ch21_ulysses_wins(masked), "returned a masked value")
    judged(exercises.ch21_ulysses_wins(lambda h, k, n: k % n == 0), "the ring sends fewer")
    ties_win = lambda h, k, n: k % n == 0 and h + k <= k * n  # noqa: E731 - 8, 8, 2: a tie
    judged(exercises.ch21_ulysses_wins(ties_win), "both send the same bytes")
    judged(exercises.ch21_ulysses_wins(lambda h, k, n: h + k < k * n), "Ulysses cannot run")
    judged(exercises.ch21_ulysses_wins(lambda h, k, n: "yes"), "return True or False")
    judged(exercises.ch21_ulysses_wins(lambda h, k: True), "should take")


def test_stash_bytes():
    size = newer.PIPELINE["microbatch_bytes"]
    assert exercises.ch21_stash_bytes(32 * size, 8 * size, 7 / 39).ok
    judged(exercises.ch21_stash_bytes(None, 8 * size, 7 / 39), "Not answered yet", "busiest")
    judged(exercises.ch21_stash_bytes(8 * size, 8 * size, 7 / 39), "GPipe")
    judged(exercises.ch21_stash_bytes(32 * size, 7 * size, 7 / 39), "stage 1", "min(m, p)")
    judged(exercises.ch21_stash_bytes(32 * size, 32 * size, 7 / 39), "1F1B")
    judged(exercises.ch21_stash_bytes(32 * size, 8 * size, 7 / 32), "forward slots")
    judged(exercises.ch21_stash_bytes(32 * size, 8 * size, float("nan")), "finite")
