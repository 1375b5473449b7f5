"""Chapter 15's checkers accept right answers and name the plausible wrong ones, in one sentence."""

import json
import math

import jax.numpy as jnp
import numpy as np

from book import exercises
from book.exercises import experts
from nbconventions import ROOT


def rejected(verdict, words):
    assert not verdict.ok and words in verdict.message, verdict.message
    assert "\n" not in verdict.message


def route_with_capacity(choices, n_experts, capacity_factor, *, token_order=False):
    tokens, k = choices.shape
    capacity = math.ceil(capacity_factor * k * tokens / n_experts)
    filled = np.zeros(n_experts, int)
    kept = np.zeros(choices.shape, bool)
    if token_order:
        order = [(i, r) for i in range(tokens) for r in range(k)]
    else:
        order = [(i, r) for r in range(k) for i in range(tokens)]
    for i, r in order:
        if filled[choices[i, r]] < capacity:
            kept[i, r] = True
            filled[choices[i, r]] += 1
    return capacity, kept


def test_capacity_accepts_the_loop_and_names_the_drops():
    verdict = exercises.ch15_capacity(route_with_capacity)
    assert verdict.ok and "dropped" in verdict.message, verdict.message


def test_every_routing_drops_something_and_order_matters_somewhere():
    drops, differs = [], []
    for tokens, k, n_experts, factor, seed in experts._ROUTINGS:
        choices = experts._routing(tokens, k, n_experts, seed)
        capacity = experts.capacity_of(tokens, k, n_experts, factor)
        kept = experts.kept_assignments(choices, n_experts, capacity)
        drops.append((~kept).sum())
        by_token = experts.kept_assignments(choices, n_experts, capacity, first_choices_first=False)
        differs.append(not np.array_equal(kept, by_token))
    assert sum(d > 0 for d in drops) >= 3 and any(differs)


def test_capacity_rejects_the_usual_mistakes():
    rejected(exercises.ch15_capacity(lambda c, e, f: None), "Not answered yet")
    rejected(exercises.ch15_capacity(None), "Not answered yet")
    rejected(
        exercises.ch15_capacity(lambda c, e, f: route_with_capacity(c, e, f, token_order=True)),
        "first choice a slot before any second",
    )
    rejected(
        exercises.ch15_capacity(
            lambda c, e, f: (f * c.shape[1] * c.shape[0] / e, route_with_capacity(c, e, f)[1])
        ),
        "round",
    )
    rejected(
        exercises.ch15_capacity(
            lambda c, e, f: (math.ceil(f * c.shape[0] / e), route_with_capacity(c, e, f)[1])
        ),
        "leaves out k",
    )
    rejected(
        exercises.ch15_capacity(lambda c, e, f: (route_with_capacity(c, e, f)[0], c > -1)),
        "more than its",
    )
    rejected(
        exercises.ch15_capacity(lambda c, e, f: (route_with_capacity(c, e, f)[0], c[:, :1] > -1)),
        "one entry per assignment",
    )
    rejected(exercises.ch15_capacity(lambda c, e, f: 4), "Return two things")


def merge_normalized(a, b):
    (o1, lse1), (o2, lse2) = a, b
    lse = jnp.logaddexp(lse1, lse2)
    return o1 * jnp.exp(lse1 - lse)[:, None] + o2 * jnp.exp(lse2 - lse)[:, None], lse


def test_merge_accepts_a_stable_merge():
    assert exercises.ch15_merge_normalized(merge_normalized).ok
    coarse = lambda a, b: tuple(x.astype(jnp.bfloat16) for x in merge_normalized(a, b))  # noqa: E731
    rejected(exercises.ch15_merge_normalized(coarse), "o is bfloat16, too coarse")


def test_merge_rejects_overflow_averages_and_a_wrong_lse():
    def naive(a, b):
        (o1, lse1), (o2, lse2) = a, b
        with np.errstate(over="ignore", invalid="ignore"):
            w1, w2 = np.exp(lse1.astype(np.float32)), np.exp(lse2.astype(np.float32))
            return (o1 * w1[:, None] + o2 * w2[:, None]) / (w1 + w2)[:, None], np.log(w1 + w2)

    rejected(exercises.ch15_merge_normalized(naive), "overflows float32")
    rejected(
        exercises.ch15_merge_normalized(lambda a, b: ((a[0] + b[0]) / 2, a[1])),
        "equal weights",
    )
    rejected(
        exercises.ch15_merge_normalized(lambda a, b: (merge_normalized(a, b)[0], a[1])),
        "lse is not",
    )
    rejected(exercises.ch15_merge_normalized(lambda a, b: None), "Not answered yet")
    rejected(exercises.ch15_merge_normalized(lambda a, b: 1 / 0), "ZeroDivisionError")


def test_masked_answers_hold_no_answer():
    def masked_kept(c, e, f):
        capacity, kept = route_with_capacity(c, e, f)
        return capacity, np.ma.masked_array(kept, mask=True)

    def masked_merge(a, b):
        o, lse = merge_normalized(a, b)
        return np.ma.masked_array(o, mask=True), lse

    rejected(exercises.ch15_capacity(masked_kept), "kept holds masked entries")
    rejected(exercises.ch15_merge_normalized(masked_merge), "o holds masked entries")

    def unmasked_kept(c, e, f):  # a mask that hides nothing holds the whole answer
        capacity, kept = route_with_capacity(c, e, f)
        return capacity, np.ma.masked_array(kept)

    assert exercises.ch15_capacity(unmasked_kept).ok


def test_all_to_all_bytes_reads_the_compiled_program():
    p = experts.A2A_PROBLEM
    capacity = math.ceil(p["capacity_factor"] * p["top_k"] * p["tokens_per_device"] / 8)
    right = 7 / 8 * 8 * capacity * p["d_model"] * 4
    assert exercises.ch15_all_to_all_bytes(right).ok
    assert exercises.ch15_all_to_all_bytes(int(right)).ok
    rejected(exercises.ch15_all_to_all_bytes(8 * capacity * p["d_model"] * 4), "whole buffer")
    rejected(exercises.ch15_all_to_all_bytes(2 * right), "both all-to-alls")
    rejected(exercises.ch15_all_to_all_bytes(right / 2), "4 bytes")
    unrounded = p["capacity_factor"] * p["top_k"] * p["tokens_per_device"] / 8
    rejected(exercises.ch15_all_to_all_bytes(right * unrounded / capacity), "rounded up")
    rejected(exercises.ch15_all_to_all_bytes(None), "Not answered yet")
    rejected(exercises.ch15_all_to_all_bytes("17024"), "must be a number of bytes")
    rejected(exercises.ch15_all_to_all_bytes(True), "must be a number of bytes")


def test_the_chapter_states_the_checkers_problem():
    """Exercise 15.3's numbers live in A2A_PROBLEM; the chapter's text must say the same."""
    path = ROOT / "notebooks" / "15_experts_and_long_sequences.ipynb"
    cells = json.loads(path.read_text())["cells"]
    text = next("".join(c["source"]) for c in cells if "### Exercise 3" in "".join(c["source"]))
    p = experts.A2A_PROBLEM
    for said in (
        f"{p['experts']} experts",
        f"{p['tokens_per_device']} tokens per device",
        f"`k = {p['top_k']}`",
        f"capacity factor of {p['capacity_factor']}",
        f"`d_model = {p['d_model']}`",
        p["dtype"],
    ):
        assert said in text, said
