"""book.timing: warm-up calls are not timed, results are waited on, the median is reported.

Every test runs on a simulated clock that only the function under test moves, so what is checked
is what ``measure`` does, never how fast this machine happens to be (timing is shown by
``make bench`` and the chapters, not asserted).
"""

import re
import time
import warnings

import pytest
from hostile_values import holding_itself, nested

from book import timing, validate
from book.errors import ReaderError


class Clock:
    """A stand-in for ``time.perf_counter`` that moves only when ``advance`` is called."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(time, "perf_counter", fake)
    return fake


def test_warmup_calls_are_not_timed(clock):
    calls = []

    def f():
        calls.append(None)
        clock.advance(0.2 if len(calls) == 1 else 0.001)  # the first call stands in for compiling
        return 1.0

    t = timing.measure(f, warmup=1, runs=5)
    assert len(calls) == 6 and len(t.runs) == 5
    assert t.runs == pytest.approx((0.001,) * 5)
    assert t.median == t.best == pytest.approx(0.001)


def test_median_ignores_one_slow_run(clock):
    delays = iter([0.0, 0.0, 0.05, 0.0, 0.0])

    def f():
        clock.advance(0.001 + next(delays))
        return 1.0

    t = timing.measure(f, warmup=0, runs=5)
    assert t.median == pytest.approx(0.001)
    assert max(t.runs) == pytest.approx(0.051)
    assert sum(t.runs) / len(t.runs) > 10 * t.median  # the mean would have been pulled up


def test_results_are_waited_on_inside_the_clock(clock):
    class Lazy:
        """Returned at once; its work takes 0.01 s and is done only when waited on."""

        waited = 0

        def block_until_ready(self):
            Lazy.waited += 1
            clock.advance(0.01)
            return self

    t = timing.measure(Lazy, warmup=1, runs=3)
    assert Lazy.waited == 4
    assert t.runs == pytest.approx((0.01,) * 3)


def test_text_and_bad_arguments():
    assert timing.format_seconds(0.0004123) == "412 µs"
    assert timing.format_seconds(0.0031) == "3.1 ms"
    assert timing.format_seconds(2.05) == "2.05 s"
    assert str(timing.Timing(0.002, 0.001, (0.001, 0.002, 0.003))).startswith("2 ms (median of 3")
    with pytest.raises(ValueError, match="runs must be a positive whole number"):
        timing.measure(lambda: 1, runs=0)


@pytest.mark.parametrize("kind", ["list", "dict", "nested"])
def test_a_result_jax_cannot_walk_is_refused_in_one_sentence(kind):
    result = nested() if kind == "nested" else holding_itself(kind)
    with pytest.raises(ReaderError, match="f returned") as caught:
        timing.measure(lambda: result, warmup=0, runs=1)
    assert "\n" not in str(caught.value)


def test_format_seconds_shows_exact_real_numbers():
    from decimal import Decimal
    from fractions import Fraction

    assert timing.format_seconds(Fraction(1, 2)) == "500 ms"
    assert timing.format_seconds(Decimal("0.003")) == "3 ms"
    assert timing.format_seconds(Decimal("NaN")) == "nan s"
    assert timing.format_seconds(Decimal("sNaN")) == "nan s"
    assert timing.format_seconds(-0.0) == timing.format_seconds(Decimal("-0")) == "0 µs"


def test_format_seconds_writes_a_huge_duration_short():
    assert timing.format_seconds(1e308) == "1e+308 s"
    assert timing.format_seconds(259_200) == "259,200 s"


def test_measure_names_a_donated_argument():
    import jax
    import jax.numpy as jnp

    with pytest.raises(ReaderError, match="donate_argnums deletes it"):
        timing.measure(jax.jit(lambda x: x * 2, donate_argnums=0), jnp.ones(3), runs=2)


def test_a_result_dict_with_keys_jax_cannot_sort_is_waited_on():
    import jax.numpy as jnp

    x = jnp.ones(4)
    timed = timing.measure(lambda: {"loss": x + 1, 0: x}, warmup=0, runs=2)
    assert len(timed.runs) == 2


@pytest.mark.parametrize(
    "f, args, kwargs",
    [
        (lambda a, b: a + b, (1,), {}),
        (lambda x, runs: x * runs, (1,), {}),  # runs= is measure's own
        (lambda: 0, (1, 2), {}),
    ],
)
def test_arguments_the_function_cannot_take_are_named_in_one_sentence(f, args, kwargs):
    with pytest.raises(ReaderError, match="cannot be called with these arguments") as caught:
        timing.measure(f, *args, warmup=0, runs=1, **kwargs)
    assert "\n" not in str(caught.value)


def test_a_functions_own_error_about_deletion_is_its_own():
    def f():
        raise RuntimeError("cache entry deleted while in use")

    with pytest.raises(RuntimeError, match="cache entry deleted"):
        timing.measure(f, warmup=0, runs=1)


def test_a_function_with_a_parameter_named_f_is_timed():
    timed = timing.measure(lambda f: f + 1, f=1, warmup=0, runs=2)
    assert len(timed.runs) == 2


def test_a_result_made_of_a_donated_buffer_is_named_in_one_sentence():
    import jax
    import jax.numpy as jnp

    step = jax.jit(lambda x: x, donate_argnums=0)
    x = jnp.ones(8)
    with pytest.raises(ReaderError, match="donate_argnums"):
        timing.measure(lambda: step(x), warmup=0, runs=3)


def test_measure_names_a_deleted_result_not_a_donation():
    import jax.numpy as jnp

    def gives_a_deleted_array():
        out = jnp.ones(3) * 2
        out.delete()
        return out

    with pytest.raises(ReaderError, match="f returned an array that was deleted"):
        timing.measure(gives_a_deleted_array, runs=2)


def test_measure_refuses_work_that_has_not_run():
    async def step():
        time.sleep(0.2)  # never awaited, so never run

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "coroutine was never awaited" either
        for f, words in [
            (step, "f returned a coroutine (it is async def)"),
            (lambda: (time.sleep(0.1) for _ in range(2)), "f returned a generator"),
            (lambda: map(abs, [1, 2]), "f returned a map"),
        ]:
            with pytest.raises(validate.BadValue, match=re.escape(words)):
                timing.measure(f, warmup=1, runs=2)


def test_arrays_inside_results_jax_takes_for_leaves_are_waited_on():
    """A dataclass, a namespace or a deque of arrays is one leaf to jax.block_until_ready;
    timing only its dispatch would report the work as almost free."""
    import collections
    import dataclasses
    import types

    import jax
    import jax.numpy as jnp

    @dataclasses.dataclass
    class Out:
        y: jax.Array

    class Waited:  # an array stand-in that records that it was waited on
        def __init__(self):
            self.waited = 0

        def block_until_ready(self):
            self.waited += 1
            return self

    for wrap in (Out, lambda a: types.SimpleNamespace(y=a), lambda a: collections.deque([a])):
        leaf = Waited()
        timing.measure(lambda w=wrap, x=leaf: w(x), warmup=0, runs=3)
        assert leaf.waited == 3
    assert timing.measure(lambda: Out(jnp.ones(3)), warmup=0, runs=1).median > 0
