"""Chapter 18's checkers: they accept the worked solutions and name the usual mistakes."""

import numpy as np

from book import cost, exercises, sizing


def rejected(verdict, words):
    assert not verdict.ok and words in verdict.message, verdict.message


def tp_bytes(model, tp, global_batch, seq):
    stream = global_batch * seq * model.d_model * 2
    return (4 * model.layers + 2) * cost.all_reduce_bytes(stream, tp)


def test_smallest_fsdp():
    h100 = sizing.HARDWARE["H100"].hbm_bytes
    llama = sizing.PRESETS["Llama 3 8B"]
    smallest = next(
        k
        for k in (2**i for i in range(9))
        if sizing.plan(llama, fsdp=k, global_batch=256, seq=4096).memory["total"] <= h100
    )
    assert exercises.ch18_smallest_fsdp(smallest).ok
    rejected(exercises.ch18_smallest_fsdp(None), "Not answered yet")
    rejected(exercises.ch18_smallest_fsdp(smallest // 2), "more than an H100's 80 GB (74.5 GiB)")
    rejected(exercises.ch18_smallest_fsdp(smallest * 2), "find the smallest")
    rejected(exercises.ch18_smallest_fsdp(3), "not a power of two")
    rejected(exercises.ch18_smallest_fsdp(32.0), "find the smallest")  # 32, written 32.0
    rejected(exercises.ch18_smallest_fsdp(32.5), "must be a positive whole number")
    rejected(exercises.ch18_smallest_fsdp(np.timedelta64(16)), "must be a positive whole number")
    rejected(exercises.ch18_smallest_fsdp(True), "must be a positive whole number")


def test_tp_bytes():
    assert exercises.ch18_tp_bytes(tp_bytes).ok
    rejected(exercises.ch18_tp_bytes(None), "Not answered yet")
    rejected(exercises.ch18_tp_bytes(lambda *args: None), "Not answered yet")
    rejected(exercises.ch18_tp_bytes(42), "pass a function")

    def layers_only(model, tp, global_batch, seq):
        stream = global_batch * seq * model.d_model * 2
        return 4 * model.layers * cost.all_reduce_bytes(stream, tp)

    rejected(exercises.ch18_tp_bytes(layers_only), "the embedding and the unembedding")
    rejected(exercises.ch18_tp_bytes(lambda m, t, b, s: 2 * tp_bytes(m, t, b, s)), "bfloat16")
    rejected(exercises.ch18_tp_bytes(lambda m, t, b, s: 1 / 0), "ZeroDivisionError")
    rejected(exercises.ch18_tp_bytes(lambda m, t, b, s: "many"), "return a number of bytes")


def test_tp_bytes_blames_the_readers_own_mistakes_on_the_readers_code():
    verdict = exercises.ch18_tp_bytes(lambda m: 1)
    assert verdict.judged
    rejected(verdict, "should take (model, tp, global_batch, seq)")
    verdict = exercises.ch18_tp_bytes(lambda m, t, b, s: m.no_such_field)
    assert verdict.judged
    rejected(verdict, "Your code raised AttributeError")
    answers = iter([tp_bytes, lambda *args: None])
    rejected(exercises.ch18_tp_bytes(lambda *a: next(answers)(*a)), "Not answered yet")
