"""Checkers for chapter 19: a checkpoint interval, and a process's records after a restart."""

from __future__ import annotations

import math

import numpy as np

from book.exercises.core import (
    Wrong,
    answered,
    call,
    checker,
    need,
    numbers,
    returned,
    takes,
    whole,
)

# Exercise 19.1: jobs as (step seconds, save seconds, restart seconds, mean time between
# failures in seconds). The last saves slowly against its failure rate, where Young's square
# root is no longer the optimum.
_JOBS = (
    (0.5, 10.0, 120.0, 6 * 3600.0),
    (2.0, 60.0, 600.0, 24 * 3600.0),
    (1.0, 600.0, 300.0, 3600.0),
)
_CLOSE = 1e-4  # a goodput within this fraction of the best one counts as the best
_SIMULATED_HOURS = 20_000  # each job's simulated run, long enough for a 2% agreement


def goodput(steps: int, step_seconds, save_seconds, restart_seconds, mtbf) -> float:
    """Expected goodput with a checkpoint every ``steps`` steps and Poisson failures.

    A segment is ``steps`` steps and a save; a failure anywhere in it loses the segment, costs
    a restart, and the segment starts again. With failures at rate 1/M the expected time to
    finish a segment of length T is (M + R)(exp(T/M) - 1) (Daly 2006, without failures during
    restarts), and the goodput is the training time of a segment over that.
    """
    segment = steps * step_seconds + save_seconds
    if segment / mtbf > 700:  # exp would overflow; such a segment all but never finishes
        return 0.0
    return steps * step_seconds / ((mtbf + restart_seconds) * math.expm1(segment / mtbf))


def _best(job) -> int:
    step_seconds, save_seconds, _, mtbf = job
    young = math.sqrt(2 * save_seconds * mtbf) / step_seconds
    return max(range(1, int(4 * young) + 2), key=lambda k: goodput(k, *job))


def _simulated(steps: int, job, seed: int) -> float:
    """Goodput of a simulated run: failures drawn at random, each losing its segment."""
    step_seconds, save_seconds, restart_seconds, mtbf = job
    segment = steps * step_seconds + save_seconds
    rng = np.random.default_rng(seed)
    elapsed = trained = 0.0
    horizon = _SIMULATED_HOURS * 3600.0
    while elapsed < horizon:
        # Many segments at once: each attempt's time to the next failure.
        waits = rng.exponential(mtbf, 4096)
        for wait in waits:
            if wait >= segment:
                elapsed += segment
                trained += steps * step_seconds
            else:
                elapsed += wait + restart_seconds
            if elapsed >= horizon:
                break
    return trained / elapsed


@checker(limit=120)
def ch19_best_interval(best_interval):
    """Exercise 19.1: the steps between checkpoints that maximise the expected goodput."""
    answered(best_interval, "define best_interval(step_seconds, save_seconds, ...)")
    need(callable(best_interval), "best_interval must be a function of four numbers.")
    takes(
        best_interval,
        _JOBS[0],
        "best_interval should take four arguments, (step_seconds, save_seconds, "
        "restart_seconds, mtbf), as the exercise's cell defines it.",
    )
    said = []
    for job in _JOBS:
        got = call(best_interval, "best_interval", *job)
        answered(got, "best_interval returns None")
        try:
            got = whole(got, f"best_interval{job}", high=10**9, example=100)
        except Wrong:
            returned(got, f"best_interval{job}", "a whole number of steps, from 1 to 10**9")
        best = _best(job)
        mine, top = goodput(int(got), *job), goodput(best, *job)
        young = max(1, round(math.sqrt(2 * job[1] * job[3]) / job[0]))
        if mine < top * (1 - _CLOSE):
            hint = (
                "that is Young's square root, close only when saving is short against the "
                "time between failures; maximise the expected goodput itself"
                if int(got) == young
                else "compare the expected goodput of each interval"
            )
            raise Wrong(
                f"For steps of {job[0]} s, saves of {job[1]:g} s and a failure every "
                f"{job[3] / 3600:g} h, {got} steps give an expected goodput of {mine:.2%} "
                f"and {best} give {top:.2%}: {hint}."
            )
        said.append((job, int(got), mine, young))
    job, steps, expected, young = said[-1]
    simulated = _simulated(steps, job, seed=19)
    if abs(simulated - expected) > 0.02:  # the formula, not the reader, would be wrong
        raise RuntimeError(f"simulated goodput {simulated:.3f} against {expected:.3f}")
    return (
        f"every job's best interval; for the slowest saver, {steps} steps: expected goodput "
        f"{expected:.1%}, {simulated:.1%} in a simulated run of {_SIMULATED_HOURS:,} hours, "
        f"where Young's {young} steps give {goodput(young, *job):.1%}."
    )


# Exercise 19.2: (records, shuffle seed, global batch, step, process, process count).
_RESTARTS = (
    (96, 0, 8, 3, 1, 2),
    (96, 0, 8, 3, 3, 4),
    (120, 7, 12, 5, 2, 3),
    (64, 1, 8, 0, 0, 1),
)


def _grain_records(records, seed, batch, step, process, count) -> list[int]:
    """What Grain's ElasticIterator gives that process at that step, restored there."""
    import grain

    dataset = grain.MapDataset.source(list(range(records))).shuffle(seed=seed)
    shard = grain.sharding.ShardOptions(shard_index=process, shard_count=count, drop_remainder=True)
    data = grain.experimental.ElasticIterator(
        dataset,
        global_batch_size=batch,
        shard_options=shard,
        read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=batch),
    )
    iterator = iter(data)
    iterator.set_state({"global_next_index": step * batch})
    return [int(r) for r in next(iterator)]


def _order(records, seed) -> list[int]:
    import grain

    dataset = grain.MapDataset.source(list(range(records))).shuffle(seed=seed)
    return [int(dataset[i]) for i in range(records)]


@checker(limit=120)
def ch19_records_of(records_of):
    """Exercise 19.2: the records one process reads at one step, on any process count."""
    answered(records_of, "define records_of(order, step, process, count, batch)")
    need(callable(records_of), "records_of must be a function of five arguments.")
    records, seed, batch, step, process, count = _RESTARTS[0]
    order = _order(records, seed)
    takes(
        records_of,
        (order, step, process, count, batch),
        "records_of should take five arguments, (order, step, process, count, batch), as "
        "the exercise's cell defines it.",
    )
    for records, seed, batch, step, process, count in _RESTARTS:
        order = _order(records, seed)
        got = call(records_of, "records_of", list(order), step, process, count, batch)
        answered(got, "records_of returns None")
        ids = numbers(got, "records_of's result", "[3, 17, 42]").ravel()
        if (ids != np.round(ids)).any():
            returned(got, "records_of", "a list of record ids")
        want = _grain_records(records, seed, batch, step, process, count)
        # Said before the ids are quoted: a list of thousands, or of ids of 300 digits, is not.
        need(
            len(ids) == len(want),
            f"At step {step}, process {process} of {count} with batches of {batch} reads "
            f"{len(want)} records, not {len(ids)}: each process reads batch // count.",
        )
        need(
            ((ids >= 0) & (ids < records)).all(),
            f"records_of returned ids outside 0 to {records - 1}; return ids taken from order.",
        )
        got = [int(r) for r in ids]
        if got != want:
            start = step * batch
            contiguous = order[start + process * batch // count :][: batch // count]
            hint = (
                "that is a block of the batch; Grain deals every count-th record to each process"
                if got == contiguous
                else "read the records of the step's global batch, starting at this "
                "process's position and stepping by the process count"
            )
            if sorted(got) == sorted(want):
                hint = "the right records in another order; keep the order Grain reads them"
            raise Wrong(
                f"At step {step}, process {process} of {count} with batches of {batch} "
                f"reads {want}, not {got}: {hint}."
            )
    return (
        "records_of agrees with Grain's ElasticIterator restored at each step onto 1, 2, 3 "
        "and 4 processes."
    )
