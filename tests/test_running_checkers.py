"""Chapter 19's checkers accept a right answer and name the plausible wrong ones in one sentence."""

import math

from book import exercises
from book.exercises import running


def rejected(verdict, words):
    assert not verdict.ok and verdict.judged and words in verdict.message, verdict.message
    assert "\n" not in verdict.message


def best_interval(step_seconds, save_seconds, restart_seconds, mtbf):
    def goodput(k):
        segment = k * step_seconds + save_seconds
        return k * step_seconds / ((mtbf + restart_seconds) * math.expm1(segment / mtbf))

    young = math.sqrt(2 * save_seconds * mtbf) / step_seconds
    return max(range(1, int(4 * young) + 2), key=goodput)


def test_the_best_interval_passes_and_the_simulation_agrees():
    verdict = exercises.ch19_best_interval(best_interval)
    assert verdict.ok, verdict.message
    assert "simulated run" in verdict.message


def test_youngs_interval_is_named_where_it_is_not_the_best():
    def young(step_seconds, save_seconds, restart_seconds, mtbf):
        return max(1, round(math.sqrt(2 * save_seconds * mtbf) / step_seconds))

    rejected(exercises.ch19_best_interval(young), "Young's square root")


def test_an_interval_in_seconds_or_a_stub_is_refused():
    def in_seconds(step_seconds, save_seconds, restart_seconds, mtbf):
        return math.sqrt(2 * save_seconds * mtbf)

    rejected(exercises.ch19_best_interval(in_seconds), "whole number of steps")
    rejected(exercises.ch19_best_interval(lambda *job: None), "Not answered yet")


def test_the_expected_goodput_is_what_a_simulated_run_reaches():
    job = running._JOBS[0]
    steps = running._best(job)
    simulated = running._simulated(steps, job, seed=3)
    assert abs(simulated - running.goodput(steps, *job)) < 0.01


def records_of(order, step, process, count, batch):
    start = step * batch
    return [order[i] for i in range(start + process, start + batch, count)]


def test_records_dealt_as_grain_deals_them_pass():
    verdict = exercises.ch19_records_of(records_of)
    assert verdict.ok, verdict.message


def test_a_block_per_process_is_named():
    def blocks(order, step, process, count, batch):
        share = batch // count
        start = step * batch + process * share
        return order[start : start + share]

    rejected(exercises.ch19_records_of(blocks), "a block of the batch")


def test_the_right_records_in_another_order_are_named():
    def backwards(order, step, process, count, batch):
        return records_of(order, step, process, count, batch)[::-1]

    rejected(exercises.ch19_records_of(backwards), "in another order")


def test_a_stub_is_not_answered():
    rejected(exercises.ch19_records_of(lambda *args: None), "Not answered yet")
