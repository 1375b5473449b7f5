"""Chapter 13's checkers accept right answers and name the usual wrong ones, in one sentence."""

import math

import numpy as np
import pytest

from book import cost, exercises

RIGHT_RULES = {
    "batch": "data",
    "embed": "data",
    "heads": "model",
    "mlp": "model",
    "vocab": "model",
}
TP_RULES = {"heads": "model", "mlp": "model", "vocab": "model"}
STREAM = 32 * 16 * 64 * 4  # exercise 13.2's residual stream, in bytes
RIGHT_BYTES = 4 * cost.all_reduce_bytes(STREAM, 8)


def accepted(verdict):
    assert verdict.ok and verdict.judged, verdict.message
    assert repr(verdict).startswith("Correct: ")


def rejected(verdict, words):
    assert verdict.judged and not verdict.ok, verdict.message
    assert words in verdict.message, verdict.message
    assert "\n" not in verdict.message


def test_rules_accept_fsdp_and_dp_over_data_with_tp_over_model():
    accepted(exercises.ch13_fsdp_tp_rules(RIGHT_RULES))
    # Names no array of the model has, a tuple of one axis and an explicit None change nothing.
    same = {**RIGHT_RULES, "batch": ("data",), "seq": None, "layers": None, "experts": "model"}
    accepted(exercises.ch13_fsdp_tp_rules(same))


@pytest.mark.parametrize(
    "rules, words",
    [
        (None, "Not answered yet"),
        ([("batch", "data")], "make it a dict"),
        ({**RIGHT_RULES, "batch": "fsdp"}, "this mesh has the axes 'data' and 'model'"),
        # TP alone: the batch is whole.
        (TP_RULES, "the residual stream ('batch', 'seq', 'embed') gets P(None, None, None)"),
        # DP x TP: the batch split, the weights whole.
        (
            {"batch": "data", **TP_RULES},
            "blocks/attn_norm ('layers', 'embed') gets P(None, None)",
        ),
        # FSDP without DP: the weights split, the batch whole.
        ({"embed": "data", **TP_RULES}, "the residual stream"),
        # The axes swapped.
        (
            {"batch": "model", "embed": "model", "heads": "data", "mlp": "data", "vocab": "data"},
            "FSDP over data and TP over model split it as P('data', None, None)",
        ),
        # The vocabulary left whole: the embedding and the unembedding differ.
        ({**RIGHT_RULES, "vocab": None}, "embed ('vocab', 'embed')"),
        # The MLP not split: w_in and w_out differ.
        ({**RIGHT_RULES, "mlp": None}, "blocks/w_in"),
    ],
)
def test_rules_name_what_is_split_wrong(rules, words):
    rejected(exercises.ch13_fsdp_tp_rules(rules), words)


def _nested(depth):
    value = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    "rules",
    [
        42,
        "data",
        {"batch": 3},
        {"batch": ["data"]},
        {"batch": ("data", 7)},
        {"batch": ("data", "data"), "embed": "data"},
        {("batch",): "data"},
        {"batch": object()},
        {"batch": float("nan")},
        {"batch": ["data"] * 10**6},
        {"batch": _nested(10**4)},  # its repr is past Python's recursion limit
    ],
)
def test_rules_never_raise_on_garbage(rules):
    verdict = exercises.ch13_fsdp_tp_rules(rules)
    assert not verdict.ok and "\n" not in verdict.message
    assert verdict.judged and len(verdict.message) < 400, verdict.message


def test_block_bytes_accepts_the_ring_bytes_of_four_all_reduces():
    accepted(exercises.ch13_block_bytes(RIGHT_BYTES))
    accepted(exercises.ch13_block_bytes(int(RIGHT_BYTES)))
    accepted(exercises.ch13_block_bytes(np.float32(RIGHT_BYTES)))
    accepted(exercises.ch13_block_bytes(RIGHT_BYTES + 3))  # a rounding slip is fine


@pytest.mark.parametrize(
    "answer, words",
    [
        (None, "Not answered yet"),
        ("917504", "must be a number of bytes, not '917504' (a string)"),
        (True, "must be a number of bytes, not True"),
        (2 * cost.all_reduce_bytes(STREAM, 8), "the forward loop only"),
        (4 * STREAM, "the sizes of the four arrays"),
        (4 * cost.all_reduce_bytes(STREAM / 8, 8), "TP does not split the batch"),
        (8 * cost.all_reduce_bytes(STREAM, 8), "count each all-reduce once per layer"),
        (12_345, "count the all-reduces per block"),
        (RIGHT_BYTES / 4, "that is a batch of 8 sequences"),  # the chapter's own batch
        (RIGHT_BYTES * 3, "that is a batch of 96 sequences"),
        (3 * cost.all_reduce_bytes(STREAM, 8), "that is 3 all-reduces of the stream a layer"),
        (5 * cost.all_reduce_bytes(STREAM, 8), "a fifth is full remat's recomputation"),
        (-RIGHT_BYTES, "count the all-reduces per block"),
    ],
)
def test_block_bytes_names_the_usual_mistakes(answer, words):
    rejected(exercises.ch13_block_bytes(answer), words)


@pytest.mark.parametrize(
    "answer",
    [math.nan, math.inf, -math.inf, 10**400, 1j, np.complex64(1), [917_504], {"bytes": 1}],
)
def test_block_bytes_never_raises_on_garbage(answer):
    verdict = exercises.ch13_block_bytes(answer)
    assert verdict.judged and not verdict.ok, verdict.message
    assert "\n" not in verdict.message


FSDP_TP = {**RIGHT_RULES, "batch": "fsdp", "embed": "fsdp"}


def test_memory_budget_is_a_share_of_dp():
    from book import layouts
    from book.exercises import transformer

    dp = layouts.analyze("DP", "8").total_bytes
    assert transformer.memory_budget() == round(0.6 * dp)


@pytest.mark.parametrize(
    "rules, mesh_shape",
    [
        (FSDP_TP, "4x2"),  # the worked solution
        ("FSDP", "8"),  # a table of the chapter, by name
        ({"batch": "fsdp", "embed": "fsdp"}, (8,)),  # the mesh as sizes
    ],
)
def test_memory_budget_accepts_layouts_that_fit(rules, mesh_shape):
    verdict = exercises.ch13_memory_budget(rules, mesh_shape)
    accepted(verdict)
    assert "of the budget" in verdict.message


@pytest.mark.parametrize(
    "rules, mesh_shape, words",
    [
        (None, "4x2", "Not answered yet"),
        (FSDP_TP, None, "Not answered yet"),
        ("DP", "8", "most of it is parameters"),
        (TP_RULES, "8", "most of it is temporaries"),
        (FSDP_TP, "8", "name 2 mesh axes, fsdp, model, but the mesh 8 has 1 size"),
        ({"batch": "data"}, "3", "which does not divide evenly"),
        ({"emb": "fsdp"}, "8", "is not a logical name of this model"),
    ],
)
def test_memory_budget_says_what_to_change(rules, mesh_shape, words):
    rejected(exercises.ch13_memory_budget(rules, mesh_shape), words)


@pytest.mark.parametrize(
    "rules, mesh_shape",
    [
        (42, "8"),
        ({"batch": object()}, "8"),
        ({"batch": ("data", 7)}, "8"),
        ({("batch",): "data"}, "8"),
        ({"batch": "data"}, 8.0),
        ({"batch": "data"}, "0"),
        ({"batch": "data"}, "8" * 30),
        ({"batch": "data"}, [True]),
        ({"batch": "data"}, {"data": 8}),
    ],
)
def test_memory_budget_never_raises_on_garbage(rules, mesh_shape):
    verdict = exercises.ch13_memory_budget(rules, mesh_shape)
    assert verdict.judged and not verdict.ok, verdict.message
    assert "\n" not in verdict.message
