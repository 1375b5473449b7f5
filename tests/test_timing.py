"""book.timing: warm-up calls are not timed, results are waited on, the median is reported."""

import time

import jax.numpy as jnp
import pytest

from book import timing


def test_warmup_calls_are_not_timed():
    calls = []

    def f():
        calls.append(None)
        if len(calls) == 1:  # the first call stands in for compilation
            time.sleep(0.2)
        return jnp.ones(3)

    t = timing.measure(f, warmup=1, runs=5)
    assert len(calls) == 6 and len(t.runs) == 5
    assert t.median < 0.1 and t.best <= t.median


def test_median_ignores_one_slow_run():
    delays = iter([0.0, 0.0, 0.05, 0.0, 0.0])

    def f():
        time.sleep(next(delays))
        return 1.0

    t = timing.measure(f, warmup=0, runs=5)
    assert t.median < 0.02 and max(t.runs) >= 0.05


def test_results_are_waited_on():
    class Lazy:
        waited = False

        def block_until_ready(self):
            Lazy.waited = True
            return self

    timing.measure(Lazy, warmup=0, runs=1)
    assert Lazy.waited


def test_text_and_bad_arguments():
    assert timing.format_seconds(0.0004123) == "412 µs"
    assert timing.format_seconds(0.0031) == "3.1 ms"
    assert timing.format_seconds(2.05) == "2.05 s"
    assert str(timing.Timing(0.002, 0.001, (0.001, 0.002, 0.003))).startswith("2 ms (median of 3")
    with pytest.raises(ValueError, match="runs >= 1"):
        timing.measure(lambda: 1, runs=0)
