"""The exercise checkers under a hostile or clumsy reader, second round.

Every checker is given, in each of its answers, a wrong kind of thing: nothing, a number of 400
digits, nan, a text, a container that holds itself, a function of the wrong signature or one
that returns any of these. The verdict must judge the answer in one sentence; a verdict saying
the checker itself failed is a bug of the checker, since it could have named what it was given.

Then answers that change the reader's world: global JAX settings, the clocks, the working
folder and environment, processes and threads started, an answer that never returns. After the
verdict everything is as it was.
"""

import builtins
import functools
import inspect
import io
import math
import os
import subprocess
import sys
import threading
import time
import warnings
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hostile_values import NegativeLength, Unprintable, holding_itself, leaked_tracer, lying
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import book.exercises.core as core
import book.timing
from book import exercises
from book.exercises import profiling

FN = object()  # an answer that is a function: wrong ones are drawn from FUNCTIONS

# A right or plausible answer for each argument, so that the wrong one drawn for another
# argument is the one judged. A checker not listed gets a function or nothing in each.
ANSWERS = {
    "ch02_predict": ((16, 1, 4), 1),
    "ch02_rows_on_device_1": ([2],),
    "ch02_spec_for_64_bytes": (P("pipe", "data"),),
    "ch03_no_communication": (P("data", None), P(None, "model")),
    "ch03_sum_groups": ([[0, 4], [1, 5], [2, 6], [3, 7]], P("model")),
    "ch04_predict_types": (
        P("model", "data"),
        P("data", "model"),
        P("data", "model"),
        {"concatenated", "sliced"},
    ),
    "ch05_predict_all_to_all": ((8, 1), [103, 113, 123, 133, 143, 153, 163, 173]),
    "ch12_dp_tp_bytes": (100_000,),
    "ch13_block_bytes": (1_000_000,),
    "ch13_fsdp_tp_rules": ({"batch": "data", "embed": "data", "heads": "model"},),
    "ch13_memory_budget": ({"batch": "data"}, "8"),
    "ch14_in_flight": ([4] * 6, (4, 4, 4, 3, 2, 1)),
    "ch14_microbatches": (63, 16),
    "ch15_all_to_all_bytes": (17_024,),
    "ch16_restore_on": (
        FN,
        {"w1": P("data", "model"), "b1": P("data"), "w2": P("model", "data"), "b2": P()},
    ),
    "ch17_collective_share": (FN, profiling._ops(profiling._RUN), dict(profiling._KINDS)),
    "ch18_smallest_fsdp": (64,),
    "ch20_largest_batch": (185, 975.0),  # the right batch: a wrong per_chip is judged too
    "ch20_tp_token_bytes": (14_336,),
    "ch21_stash_bytes": (2**31, 2**29, 0.18),
}
# Exercises whose checker runs the reader's function in other processes: a wrong function
# there costs a launch, so they are given only wrong values here.
IN_PROCESSES = {"ch11_column_means", "ch11_own_rows"}
# Checkers that compile a training step for every answer: fewer examples keep the run short.
SLOW = {
    "ch07_sum_dp",
    "ch07_masked_mean",
    "ch08_fsdp_columns",
    "ch08_replicated_biases",
    "ch09_two_layers",
    "ch09_megatron_block",
    "ch13_fsdp_tp_rules",
    "ch13_memory_budget",
    "ch16_masked_mean_grads",
    "ch16_restore_on",
}


WRONG = st.one_of(
    st.sampled_from([None, ..., True, 0, -1, 10**400, -(10**400), 2**64]),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308 * 10, -0.5, 1 + 2j, Fraction(1, 3)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.sampled_from(["8", "(8, 1)", "P('data')", ""]),
    st.binary(max_size=3),
    st.lists(st.text(max_size=2), max_size=3),
    st.lists(st.lists(st.integers(-2, 9), max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(-2, 2), max_size=2),
    st.sets(st.integers(0, 3), max_size=2),
    st.sampled_from(["list", "dict"]).map(holding_itself),
    st.builds(object),
    st.builds(Unprintable),
    st.builds(lambda: np.array([object(), 1], dtype=object)),
    st.builds(np.float32, st.floats(width=32)),
    st.builds(lambda: jnp.float32(2.0)),
    st.builds(lambda: np.arange(3)),
)
FUNCTIONS = st.one_of(
    WRONG.map(lambda value: lambda *args, **kwargs: value),
    st.sampled_from([lambda: 1.0, lambda a, b, c, d, e, f, g: 1.0]),
)
QUICK = settings(
    max_examples=10,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
FEW = settings(QUICK, max_examples=3)


def checkers():
    return [n for n in exercises.__all__ if n.startswith("ch")]


def judged_in_one_sentence(verdict):
    assert isinstance(verdict, core.Verdict)
    assert verdict.judged, verdict.message
    assert "checker itself failed" not in verdict.message, verdict.message
    message = verdict.message
    assert message and "\n" not in message and message.endswith("."), message
    assert len(message) < 600, message


def wrong_answers(name, draw):
    """The checker's answers, one of them wrong: a wrong value, or for a function a wrong one."""
    checker = getattr(exercises, name)
    count = len(inspect.signature(inspect.unwrap(checker)).parameters)
    answers = list(ANSWERS.get(name, (FN,) * count))
    position = draw(st.integers(0, count - 1))
    functions = answers[position] is FN and name not in IN_PROCESSES
    answers[position] = draw(st.one_of(WRONG, FUNCTIONS) if functions else WRONG)
    return [(lambda *args: None) if a is FN else a for a in answers]


@pytest.mark.parametrize("name", checkers())
def test_a_wrong_kind_of_answer_is_judged_never_blamed_on_the_checker(name):
    drawn = settings(FEW if name in SLOW else QUICK)

    @drawn
    @given(st.data())
    def check(data):
        judged_in_one_sentence(getattr(exercises, name)(*wrong_answers(name, data.draw)))

    check()


# Answers that change the reader's world, or never return -----------------------------------


def checker_threads():
    return [t for t in threading.enumerate() if t.name.startswith("checker ")]


def wait_for_no_checker_thread(seconds=20):
    deadline = time.monotonic() + seconds
    while checker_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not checker_threads()


@pytest.fixture
def short_limits(monkeypatch):
    monkeypatch.setattr(core, "TIME_LIMIT", 0.5)
    monkeypatch.setattr(core, "_GRACE", 0.5)


def test_global_jax_settings_an_answer_changes_are_put_back():
    before = jax.config.jax_enable_x64, jax.config.jax_disable_jit

    def step_flops(sizes):
        jax.config.update("jax_enable_x64", True)
        jax.config.update("jax_disable_jit", True)
        return 1.0

    verdict = exercises.ch17_step_flops(step_flops)
    assert verdict.judged and not verdict.ok, verdict.message
    assert (jax.config.jax_enable_x64, jax.config.jax_disable_jit) == before == (False, False)
    assert jnp.ones(2).dtype == jnp.float32


def test_processes_threads_folder_and_environment_an_answer_leaves_are_cleaned_up(tmp_path):
    started, running = [], threading.Event()
    here = os.getcwd()

    def spin():
        running.set()
        while True:
            time.sleep(0.01)

    def step_flops(sizes):
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]))
        started.append(threading.Thread(target=spin, daemon=True))
        started[-1].start()
        running.wait(5)
        os.chdir(tmp_path)
        os.environ["BOOK_LEFT_BEHIND"] = "1"
        return 1.0

    verdict = exercises.ch17_step_flops(step_flops)
    process, thread = started
    assert verdict.judged and not verdict.ok, verdict.message
    assert os.getcwd() == here and "BOOK_LEFT_BEHIND" not in os.environ
    process.wait(timeout=10)  # killed, not waited for 120 s
    thread.join(10)
    assert not thread.is_alive()


def test_a_process_an_answer_started_is_reaped_not_left_a_zombie():
    pids = []

    def intensity(m, k, n):
        pids.append(subprocess.Popen(["sleep", "60"]).pid)
        return 1.0

    verdict = exercises.ch12_intensity(intensity)
    assert verdict.judged and not verdict.ok and pids
    assert not os.path.exists(f"/proc/{pids[0]}")  # killed and waited for


def test_a_checker_that_writes_a_checkpoint_leaves_no_thread_of_its_own():
    before = set(threading.enumerate())
    verdict = exercises.ch16_restore_on(lambda path, mesh: None, ANSWERS["ch16_restore_on"][1])
    assert verdict.judged and not verdict.ok
    wait_for_no_checker_thread()
    assert [t.name for t in set(threading.enumerate()) - before] == []  # orbax's metadata store


def test_an_answer_that_never_returns_leaves_no_simulated_clock(short_limits):
    """ch12_timer installs a simulated clock; a timer stuck in a long native call keeps the
    check from finishing, and the clock must not outlive the verdict."""
    real = time.perf_counter

    def seconds_per_call(f, *args):
        f(*args)
        time.sleep(3)  # one native call: the checker's stop cannot interrupt it
        return 0.02

    verdict = exercises.ch12_timer(seconds_per_call)
    assert not verdict.ok and "cannot be stopped from Python" in verdict.message
    assert time.perf_counter is real
    assert book.timing.measure(time.sleep, 0.001, warmup=0, runs=2).median > 0
    wait_for_no_checker_thread()
    assert time.perf_counter is real


def test_a_loop_that_swallows_the_stop_is_named_as_such(short_limits):
    done = threading.Event()

    def step_flops(sizes):
        while not done.is_set():
            try:
                time.sleep(0.01)
            except BaseException:  # noqa: BLE001 - the mistake this test is about
                pass
        return 1.0

    try:
        verdict = exercises.ch17_step_flops(step_flops)
        assert not verdict.ok and "catches the stop" in verdict.message, verdict.message
        assert "native code" not in verdict.message
    finally:
        done.set()
    wait_for_no_checker_thread()


def test_a_checkers_scratch_folder_goes_when_the_answer_never_returns(short_limits):
    folders = []

    def build(batch, sharding):
        folders.append(batch.source.folder)
        time.sleep(3)

    verdict = exercises.ch10_read_once(build)
    assert not verdict.ok and "still ran" in verdict.message
    assert folders and not folders[0].exists()
    wait_for_no_checker_thread()


def test_process_wide_python_settings_an_answer_changes_are_put_back():
    limit, filters, streams = sys.getrecursionlimit(), list(warnings.filters), sys.stdout
    printer = builtins.print

    def step_flops(sizes):
        sys.setrecursionlimit(60)
        warnings.simplefilter("error")
        sys.stdout = io.StringIO()
        builtins.print = lambda *args, **kwargs: None
        builtins.answer_was_here = True
        return 1.0

    verdict = exercises.ch17_step_flops(step_flops)
    assert verdict.judged and not verdict.ok, verdict.message
    assert sys.getrecursionlimit() == limit and warnings.filters == filters
    assert sys.stdout is streams
    assert builtins.print is printer and not hasattr(builtins, "answer_was_here")
    assert exercises.ch17_step_flops(lambda sizes: 1.0).judged  # the next check still runs


def test_the_interpreters_own_knobs_an_answer_turns_are_put_back():
    import gc
    import logging

    before = (gc.isenabled(), sys.get_int_max_str_digits(), sys.getswitchinterval())
    mask, path, math_module = os.umask(0o022), list(sys.path), sys.modules["math"]
    os.umask(mask)
    hooks = (sys.excepthook, threading.excepthook, threading.getprofile())

    def step_flops(sizes):
        gc.disable()
        sys.set_int_max_str_digits(640)
        sys.setswitchinterval(1.0)
        os.umask(0o777)
        logging.disable(logging.CRITICAL)
        sys.excepthook = threading.excepthook = lambda *args: None
        threading.setprofile_all_threads(lambda *args: None)
        sys.path.insert(0, "/nowhere")
        sys.modules["math"] = None
        return 1.0

    assert exercises.ch17_step_flops(step_flops).judged
    assert (gc.isenabled(), sys.get_int_max_str_digits(), sys.getswitchinterval()) == before
    assert os.umask(mask) == mask and logging.root.manager.disable == logging.NOTSET
    assert (sys.excepthook, threading.excepthook, threading.getprofile()) == hooks
    assert sys.path == path and sys.modules["math"] is math_module


class RaisesOnEveryAttribute:
    def __getattr__(self, name):
        raise RuntimeError(name)


def test_an_answer_whose_every_attribute_raises_is_judged():
    judged_in_one_sentence(exercises.ch01_chip_rows(RaisesOnEveryAttribute()))


def test_an_answer_with_a_lower_of_its_own_is_traced_as_a_function():
    from unittest import mock

    verdict = exercises.ch07_sum_dp(mock.MagicMock())  # its .lower().compile() is no program
    judged_in_one_sentence(verdict)
    assert "Your code raised" in verdict.message


def test_an_answer_that_calls_os_exit_is_judged_and_the_kernel_lives_on():
    real = os._exit

    def step_flops(sizes):
        os._exit(3)

    verdict = exercises.ch17_step_flops(step_flops)
    judged_in_one_sentence(verdict)
    assert "SystemExit (3)" in verdict.message and os._exit is real


@pytest.mark.parametrize("name", ["ch01_chip_rows", "ch01_reversed_mesh"])
@pytest.mark.parametrize("answer", [np.sum, functools.partial(int, "8")], ids=["sum", "partial"])
def test_a_library_function_that_fails_as_the_answer_is_refused_as_the_readers(name, answer):
    verdict = getattr(exercises, name)(answer)  # a partial of a built-in runs no Python line
    judged_in_one_sentence(verdict)
    assert not verdict.ok and "Your answer raised" in verdict.message


@pytest.mark.parametrize(
    "name, answers",
    [
        ("ch02_predict", ((16, 1, 4), jnp.int32(1))),
        ("ch02_predict", (np.array([16, 1, 4]), np.int64(1))),
        ("ch02_predict", (jnp.array([16, 1, 4]), jnp.int32(1))),
        ("ch02_rows_on_device_1", (jnp.array([2]),)),
        ("ch14_microbatches", (jnp.int32(63), jnp.float32(16.0))),
        ("ch14_in_flight", (jnp.full(6, 4), np.array([4, 4, 4, 3, 2, 1]))),
    ],
)
def test_a_right_answer_computed_with_jax_or_numpy_is_right(name, answers):
    verdict = getattr(exercises, name)(*answers)
    assert verdict.ok, verdict.message


@pytest.mark.parametrize("answer", [int, dict, len, sum], ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "name", ["ch01_chip_rows", "ch01_reversed_mesh", "ch14_stage_work", "ch18_tp_bytes"]
)
def test_a_class_or_a_builtin_as_the_answer_is_refused_as_the_readers(name, answer):
    """Neither has a line of its own, so what it raises was blamed on the checker."""
    verdict = getattr(exercises, name)(answer)
    judged_in_one_sentence(verdict)
    assert not verdict.ok and answer.__name__ in verdict.message


@pytest.mark.parametrize(
    "name, answers",
    [
        ("ch02_predict", (lying("list", [16, 1, 4]), 1)),
        (
            "ch05_predict_all_to_all",
            (lying("tuple", (8, 1)), ANSWERS["ch05_predict_all_to_all"][1]),
        ),
    ],
)
def test_a_shape_of_a_list_subclass_is_read_for_what_it_holds(name, answers):
    verdict = getattr(exercises, name)(*answers)
    assert verdict.ok, verdict.message


@pytest.mark.parametrize("name", ["ch14_stage_work", "ch15_capacity", "ch15_merge_normalized"])
def test_a_pair_returned_as_a_list_subclass_is_read_for_what_it_holds(name):
    verdict = getattr(exercises, name)(lambda *args: NegativeLength([8, 8]))
    judged_in_one_sentence(verdict)
    assert not verdict.ok


@pytest.mark.parametrize("result", [leaked_tracer, lambda: "x" * 10**6], ids=["tracer", "text"])
def test_a_number_of_bytes_that_is_a_leaked_tracer_or_a_long_text_is_named(result):
    verdict = exercises.ch18_tp_bytes(lambda *args: result())
    judged_in_one_sentence(verdict)
    assert not verdict.ok


def test_a_long_name_in_an_answer_is_not_quoted_whole():
    verdict = exercises.ch04_predict_types(*ANSWERS["ch04_predict_types"][:3], {"x" * 10**6})
    judged_in_one_sentence(verdict)
    assert not verdict.ok


# Chapters 19 and 20: answers that are not the reader's own functions, or numbers of 300 digits


@pytest.mark.parametrize("answer", [int, type, np.sum, float], ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", ["ch19_best_interval", "ch19_records_of"])
def test_a_builtin_or_library_function_as_the_answer_is_refused_as_the_readers(name, answer):
    verdict = getattr(exercises, name)(answer)
    judged_in_one_sentence(verdict)
    assert not verdict.ok


@pytest.mark.parametrize("steps", [10**9, 10**9 - 1, 2**40])
def test_a_huge_checkpoint_interval_is_judged(steps):
    verdict = exercises.ch19_best_interval(lambda *job: steps)
    judged_in_one_sentence(verdict)
    assert not verdict.ok


@pytest.mark.parametrize(
    "result", [list(range(100_000)), [1e300] * 4, [10**30] * 4, [-1] * 4, [96] * 4]
)
def test_records_that_cannot_be_quoted_are_described(result):
    verdict = exercises.ch19_records_of(lambda *args: result)
    judged_in_one_sentence(verdict)
    assert not verdict.ok and len(verdict.message) < 200, verdict.message


@pytest.mark.parametrize("value", [1e308, -1e300, Fraction(1, 3), 0.25])
def test_a_huge_or_fractional_number_is_quoted_as_it_is(value):
    for verdict in (
        exercises.ch12_dp_tp_bytes(value),
        exercises.ch13_block_bytes(value),
        exercises.ch15_all_to_all_bytes(value),
        exercises.ch20_tp_token_bytes(value),
        exercises.ch20_largest_batch(185, value),
    ):
        judged_in_one_sentence(verdict)
        assert len(verdict.message) < 300 and "Not 0 bytes" not in verdict.message
        assert "Not -0 bytes" not in verdict.message


@pytest.mark.parametrize("name", ["ch06_both_ways", "ch11_column_means", "ch14_stage_work"])
@pytest.mark.parametrize("answer", [np.int64(3), np.arange(2), "f"], ids=repr)
def test_an_answer_that_is_no_function_is_named_as_describe_names_it(name, answer):
    verdict = getattr(exercises, name)(answer)
    judged_in_one_sentence(verdict)
    assert " a int64" not in verdict.message and " a ndarray" not in verdict.message
    assert " a str." not in verdict.message


def test_a_batch_on_one_device_is_a_verdict_not_a_checker_failure():
    import jax.numpy as jnp

    verdict = exercises.ch10_read_once(lambda batch, sharding: jnp.asarray(batch.read()))
    assert not verdict.ok and "on one device only" in verdict.message


def test_what_an_answer_changes_in_the_books_own_modules_is_put_back():
    import book.cost
    import book.sizing

    presets = dict(book.sizing.PRESETS)

    def answer(model, tp, batch, seq):
        book.cost.all_reduce_bytes = lambda nbytes, n: 0.0
        book.sizing.PRESETS.clear()
        return 1.0

    exercises.ch18_tp_bytes(answer)
    assert book.cost.all_reduce_bytes(1024, 8) == 1792.0
    assert book.sizing.PRESETS == presets


def test_an_answer_that_seeds_numpys_global_generator_leaves_the_readers_stream():
    import numpy as np

    np.random.seed(0)
    expected = np.random.RandomState(0).rand(2)[1]
    np.random.rand()

    def answer(*args):
        np.random.seed(123)
        return None

    exercises.ch18_tp_bytes(answer)
    assert np.random.rand() == expected
