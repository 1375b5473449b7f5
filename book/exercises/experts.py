"""Checkers for chapter 15: routing with a capacity, merging attention blocks, all-to-all bytes.

Each one tries the reader's answer on problems of its own (fresh routings, fresh attention
scores, the compiled all-to-all) and answers in one sentence.
"""

from __future__ import annotations

import math

import numpy as np

from book import validate
from book.exercises.core import (
    Wrong,
    answered,
    checker,
    full_precision,
    function,
    line_mesh,
    need,
    number,
    unmasked,
)
from book.exercises.core import shown as _shown

# Exercise 15.3's problem: the chapter's text states these numbers.
A2A_PROBLEM = {
    "tokens_per_device": 60,
    "top_k": 2,
    "capacity_factor": 1.25,
    "d_model": 32,
    "experts": 8,
    "dtype": "float32",
}

# (tokens, top_k, experts, capacity factor, seed): capacities of 4, 5, 4 and 2, with drops.
_ROUTINGS = [
    (16, 2, 8, 1.0, 1501),
    (12, 1, 4, 1.5, 1502),
    (10, 2, 8, 1.25, 1503),
    (6, 2, 4, 0.5, 1504),
]


def capacity_of(tokens, top_k, experts, capacity_factor) -> int:
    """Slots per expert for one device's tokens: ``ceil(capacity_factor * top_k * tokens / E)``."""
    return math.ceil(capacity_factor * top_k * tokens / experts)


def kept_assignments(choices, experts, capacity, first_choices_first=True) -> np.ndarray:
    """Which of ``choices`` (tokens, k) find a slot: each expert takes assignments in order.

    The order is every token's first choice, then every token's second, and so on; with
    ``first_choices_first=False`` it is token by token instead, for the checker's diagnosis.
    """
    choices = np.asarray(choices)
    tokens, k = choices.shape
    filled = np.zeros(experts, int)
    kept = np.zeros((tokens, k), bool)
    order = (
        [(i, r) for r in range(k) for i in range(tokens)]
        if first_choices_first
        else [(i, r) for i in range(tokens) for r in range(k)]
    )
    for i, r in order:
        e = choices[i, r]
        if filled[e] < capacity:
            kept[i, r] = True
            filled[e] += 1
    return kept


def _routing(tokens, k, experts, seed) -> np.ndarray:
    """Each token's k distinct experts, skewed towards the first few so that some overflow."""
    rng = np.random.default_rng(seed)
    weights = np.linspace(2.0, 1.0, experts)
    weights /= weights.sum()
    return np.stack([rng.choice(experts, k, replace=False, p=weights) for _ in range(tokens)])


@checker
def ch15_capacity(route_with_capacity):
    """Exercise 15.1: each expert's capacity, and which assignments it keeps, for one device."""
    function(
        route_with_capacity,
        "route_with_capacity",
        (_routing(4, 2, 8, 1500), 8, 1.25),
        "(choices, n_experts, capacity_factor)",
    )
    shown = None
    for tokens, k, experts, factor, seed in _ROUTINGS:
        choices = _routing(tokens, k, experts, seed)
        capacity = capacity_of(tokens, k, experts, factor)
        kept = kept_assignments(choices, experts, capacity)
        answer = validate.plain(route_with_capacity(choices.copy(), experts, factor))
        answered(answer, "route_with_capacity returns nothing yet; return (capacity, kept)")
        need(
            isinstance(answer, (tuple, list)) and len(answer) == 2,
            "Return two things, (capacity, kept): the slots per expert and which assignments "
            "find one.",
        )
        got_capacity, got_kept = answer
        answered(got_capacity, "the capacity is None; return a whole number of slots")
        answered(got_kept, "kept is None; return an array of the shape of choices")
        case = f"{tokens} tokens, k = {k}, {experts} experts, capacity factor {factor}"
        got_capacity = number(got_capacity, f"The capacity for {case}", "a number of slots")
        exact = factor * k * tokens / experts
        need(
            got_capacity != exact or exact == capacity,
            f"For {case} the capacity {got_capacity:g} is not a whole number of slots; round "
            "it up.",
        )
        need(
            got_capacity != math.floor(exact) or math.floor(exact) == capacity,
            f"For {case} the capacity is rounded down to {got_capacity:g}; round it up, so "
            "that the buffers hold at least capacity_factor times the average load.",
        )
        need(
            got_capacity != math.ceil(factor * tokens / experts) or k == 1,
            f"For {case} the capacity {got_capacity:g} leaves out k: each token makes {k} "
            "assignments, so the experts share k times as many.",
        )
        need(
            got_capacity == capacity,
            f"For {case} the capacity is not {got_capacity:g}: the average expert gets "
            "k * tokens / experts assignments, times the capacity factor, rounded up.",
        )
        unmasked(got_kept, "kept", "a plain array of True and False")
        try:
            got = np.asarray(got_kept)
        except Exception:
            raise Wrong("kept should be an array of True and False.") from None
        need(
            got.shape == choices.shape,
            f"kept has shape {got.shape}; it needs one entry per assignment, the shape of "
            f"choices, {choices.shape}.",
        )
        need(
            got.dtype == bool or np.isin(got, (0, 1)).all(),
            "kept should hold True and False (or 1 and 0), one per assignment.",
        )
        got = got.astype(bool)
        if np.array_equal(got, kept):
            if shown is None:
                shown = (case, capacity, int((~kept).sum()), kept.size)
            continue
        per_expert = np.bincount(choices[got], minlength=experts)
        need(
            per_expert.max() <= capacity,
            f"For {case} expert {per_expert.argmax()} keeps {per_expert.max()} assignments, "
            f"more than its {capacity} slots.",
        )
        token_order = kept_assignments(choices, experts, capacity, first_choices_first=False)
        need(
            not np.array_equal(got, token_order) or k == 1,
            f"For {case} the slots go token by token, both choices at once; give every "
            "token's first choice a slot before any second choice.",
        )
        need(
            got.sum() >= kept.sum(),
            f"For {case} only {got.sum()} of {kept.size} assignments are kept, but "
            f"{kept.sum()} fit: an assignment is dropped only when its expert is full.",
        )
        raise Wrong(
            f"For {case} a different set of assignments is kept: each expert fills its slots "
            "in order, every token's first choice before any second choice."
        )
    case, capacity, dropped, total = shown
    return (
        f"for {case}, each expert has {capacity} slots and {dropped} of {total} assignments "
        f"are dropped; all {len(_ROUTINGS)} routings checked."
    )


def _block_results(q, k, v, mask):
    """A block's normalised output and the log-sum-exp of its scores (float64 reference)."""
    s = np.einsum("qd,kd->qk", q, k) / math.sqrt(q.shape[-1])
    s = np.where(mask, s, -np.inf)
    top = s.max(-1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    p = np.where(mask, np.exp(s - safe), 0.0)
    total = p.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.where(total > 0, p @ v / np.where(total > 0, total, 1.0), 0.0)
        lse = np.where(total[:, 0] > 0, safe[:, 0] + np.log(total[:, 0]), -np.inf)
    return o, lse


@checker
def ch15_merge_normalized(merge_normalized):
    """Exercise 15.2: merge two blocks' normalised outputs by their log-sum-exps, stably."""
    pieces = (np.zeros((1, 1)), np.zeros(1))
    function(merge_normalized, "merge_normalized", (pieces, pieces), "(a, b)")
    rng = np.random.default_rng(1505)
    queries, keys, dim, split = 6, 10, 8, 4
    cases = [("random scores", 1.0, False), ("scores in the hundreds", 60.0, False)]
    cases.append(("a block that some queries cannot see", 1.0, True))
    for what, scale, masked in cases:
        q = rng.standard_normal((queries, dim)) * scale
        k, v = rng.standard_normal((keys, dim)), rng.standard_normal((keys, dim))
        mask = np.ones((queries, keys), bool)
        if masked:  # the first three queries see only the first block
            mask[:3, split:] = False
        o_full, lse_full = _block_results(q, k, v, mask)
        parts = [
            _block_results(q, k[cols], v[cols], mask[:, cols])
            for cols in (slice(0, split), slice(split, keys))
        ]
        (o1, l1), (o2, l2) = [(o.astype(np.float32), lse.astype(np.float32)) for o, lse in parts]
        answer = validate.plain(merge_normalized((o1, l1), (o2, l2)))
        answered(answer, "merge_normalized returns nothing yet; return (o, lse)")
        need(
            isinstance(answer, (tuple, list)) and len(answer) == 2,
            "Return two things, (o, lse): the merged output and its log-sum-exp.",
        )
        unmasked(answer[0], "o", "plain arrays of numbers")
        unmasked(answer[1], "lse", "plain arrays of numbers")
        full_precision(answer[0], "o")
        full_precision(answer[1], "lse")
        try:
            o, lse = (np.asarray(a, dtype=np.float64) for a in answer)
        except Exception:
            raise Wrong("Return o and lse as arrays of numbers.") from None
        need(
            o.shape == o_full.shape and lse.shape == lse_full.shape,
            f"The merged o has shape {o.shape} and lse {lse.shape}; they keep the shapes of "
            f"each block's, {o_full.shape} and {lse_full.shape}.",
        )
        if not (np.isfinite(o).all() and np.isfinite(lse).all()):
            need(
                scale == 1.0,
                f"With {what}, exp(lse) overflows float32 and the result is not finite; "
                "subtract the larger lse before taking exponentials.",
            )
            raise Wrong(
                f"With {what}, the merge gives values that are not finite; a block no query "
                "row can see has lse = -inf and o = 0, which should count for nothing."
            )
        need(
            not np.allclose(o, (o1 + o2) / 2, atol=1e-4) or np.allclose(o, o_full, atol=1e-4),
            "The blocks are averaged with equal weights; weight each block's output by its "
            "share of the softmax denominator, exp(lse) over the sum of both.",
        )
        need(
            np.allclose(o, o_full, rtol=1e-4, atol=1e-4),
            f"With {what}, the merged output differs from attention over all the keys.",
        )
        need(
            np.allclose(lse, lse_full, rtol=1e-4, atol=1e-4),
            f"With {what}, the output is right but lse is not the log of the sum of both "
            "blocks' exp(lse).",
        )
    return (
        "the merged outputs and log-sum-exps equal attention over all the keys, for scores "
        "in the hundreds and for rows that cannot see one block, too."
    )


@checker
def ch15_all_to_all_bytes(sent_per_device):
    """Exercise 15.3: bytes each device sends in the dispatch all-to-all of A2A_PROBLEM."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import book.hlo
    from book import cost

    answered(sent_per_device, "set sent_per_device to a number of bytes")
    sent_per_device = number(sent_per_device, "sent_per_device", "a number of bytes")
    p = A2A_PROBLEM
    n, t, k, factor, d = (
        p["experts"],
        p["tokens_per_device"],
        p["top_k"],
        p["capacity_factor"],
        p["d_model"],
    )
    capacity = capacity_of(t, k, n, factor)
    mesh = line_mesh("expert")
    buffers = jax.device_put(
        jnp.zeros((n * n, capacity, d), p["dtype"]), NamedSharding(mesh, P("expert"))
    )

    def dispatch(block):
        return jax.lax.all_to_all(block, "expert", 0, 0, tiled=True)

    program = (
        jax.jit(jax.shard_map(dispatch, mesh=mesh, in_specs=P("expert"), out_specs=P("expert")))
        .lower(buffers)
        .compile()
    )
    (row,) = book.hlo.collectives(program)
    real = cost.ring_bytes(row)
    buffer = n * capacity * d * 4

    def sent(cap):
        return (n - 1) / n * n * cap * d * 4

    wrong = {
        buffer: "that is the whole buffer, but each device keeps the slots of its own expert",
        2 * real: "that is twice the answer, both all-to-alls; the question asks for the "
        "dispatch alone",
        real / 2: "that is half the answer: a float32 value is 4 bytes",
        sent(capacity_of(t, k, n, 1.0)): "the capacity factor is missing: each expert has "
        "room for 1.25 times its average load",
        sent(capacity_of(t, 1, n, factor)): "k is missing: each token goes to 2 experts, so "
        "the buffers hold twice as many slots",
        sent(factor * k * t / n): "the capacity is a whole number of slots, rounded up",
        (n - 1) / n * t * d * 4: "those are the tokens themselves, but the all-to-all moves "
        "the fixed-size buffers, one per expert, padded or not",
    }
    for value, why in wrong.items():
        need(
            abs(sent_per_device - value) > 0.5 or abs(value - real) <= 0.5,
            f"Not {_shown(sent_per_device)} bytes: {why}.",
        )
    need(
        abs(sent_per_device - real) <= 0.5,
        f"Not {_shown(sent_per_device)} bytes: count the slots of the buffers (experts times the "
        "capacity), the bytes of one slot, and the share that leaves the device.",
    )
    return (
        f"{real:,.0f} bytes, as the compiled all-to-all sends: {n} buffers of {capacity} slots "
        f"of {d} float32 values, of which each device keeps 1/{n}."
    )
