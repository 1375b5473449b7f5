"""A hostile or clumsy reader: arbitrary text, odd numbers and wrong kinds of things reach the
spec parser, the forms and the exercise checkers, and each answers in one sentence.

The forms must give HTML (a result, or the sentence), the parser a value or a ``SpecError``,
the checkers a ``Verdict``: never a traceback, never a wait without end, whatever the reader's
code does and whatever JAX settings the reader changed.
"""

import functools
import html
import operator
import re
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import book.exercises.core as core
from book import exercises, forms, specs
from book.forms import serving as serving_form

FORMS = settings(
    max_examples=40,
    # Only a hang fails on time: a valid choice compiles a program, which a loaded machine slows.
    deadline=timedelta(seconds=120),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
PARSER = settings(max_examples=200, deadline=timedelta(seconds=30), database=None)

ODD_DIGITS = st.sampled_from(["²", "①", "٣", "８", "½", "Ⅷ", "𝟠"])
TOKENS = st.sampled_from(
    [
        "P",
        "PartitionSpec",
        "(",
        ")",
        "[",
        "]",
        ",",
        "'data'",
        '"model"',
        "data",
        "None",
        "x",
        " ",
        "'",
        '"',
        "__import__('os')",
        "lambda",
        "*",
        "+",
        "2",
        "8",
        "-1",
        "²",
        "①",
        "ä",
    ]
)
TYPED = st.one_of(
    st.text(max_size=60),
    st.lists(TOKENS, max_size=12).map("".join),
    st.lists(
        st.one_of(st.sampled_from(["1", "2", "4", "8", "x", ",", "(", ")"]), ODD_DIGITS), max_size=8
    ).map("".join),
)
NOT_TEXT = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.just(10**10000),
    st.floats(),
    st.lists(st.text(max_size=3), max_size=3),
    st.builds(np.int64, st.integers(-9, 9)),
)
ARGUMENT = st.one_of(TYPED, NOT_TEXT)


def error_sentence(page: str) -> str | None:
    found = re.search(r"bk-error'>(.*?)</div>", page, re.S)
    return html.unescape(found.group(1)) if found else None


def assert_result_or_one_sentence(page, result_mark):
    assert isinstance(page, str)
    said = error_sentence(page)
    event("a result" if said is None else "a sentence")
    if said is None:
        assert result_mark in page, page[-300:]
    else:
        assert said and "\n" not in said and said.endswith("."), said


@PARSER
@given(TYPED)
def test_the_spec_parser_gives_a_spec_or_one_sentence(text):
    for parse in (
        specs.parse_partition_spec,
        specs.parse_shape,
        specs.parse_mesh_shape,
        specs.parse_axis_names,
    ):
        try:
            value = parse(text)
        except specs.SpecError as err:
            message = str(err)
            assert "\n" not in message and message.endswith("."), message
            continue
        assert isinstance(value, (P, tuple))
        if isinstance(value, tuple) and value and isinstance(value[0], int):
            assert all(type(v) is int and 1 <= v < 2**31 for v in value)


@PARSER
@given(NOT_TEXT)
def test_the_spec_parser_refuses_what_is_not_text(value):
    for parse in (specs.parse_partition_spec, specs.parse_shape, specs.parse_axis_names):
        with pytest.raises(specs.SpecError):
            parse(value)


@FORMS
@given(
    st.one_of(st.sampled_from(["(8, 4)", "(8,)", "(4, 4, 2)"]), ARGUMENT),
    st.one_of(st.sampled_from(["(2, 4)", "8", "2x2x2"]), ARGUMENT),
    st.one_of(st.sampled_from(["data, model", "data", "a, b, c"]), ARGUMENT),
    st.one_of(st.sampled_from(["P('data', None)", "P()", "P('model')"]), ARGUMENT),
    st.one_of(st.sampled_from(["Explicit", "Auto"]), ARGUMENT),
    st.one_of(st.booleans(), ARGUMENT),
)
def test_the_sharding_explorer_gives_html(shape, mesh, names, spec, axis_type, show_ids):
    page = forms.render_sharding(shape, mesh, names, spec, axis_type, show_ids)
    assert_result_or_one_sentence(page, "<b>device")


@FORMS
@given(
    st.one_of(st.sampled_from(forms.COLLECTIVES), ARGUMENT),
    st.one_of(st.sampled_from(["(8,)", "2x4"]), ARGUMENT),
    st.one_of(st.sampled_from(["data", "model"]), ARGUMENT),
    st.one_of(st.sampled_from(["(8,)", "(2, 8)"]), ARGUMENT),
    st.one_of(st.integers(-2, 3), ARGUMENT),
    st.one_of(st.booleans(), ARGUMENT),
    st.one_of(st.sampled_from(["shift", "ring", "(0, 1), (1, 0)"]), ARGUMENT),
)
def test_the_collective_explorer_gives_html(collective, mesh, axis, block, dim, tiled, perm):
    page = forms.render_collective(
        collective,
        mesh,
        axis,
        block_shape=block,
        dimension=dim,
        concat_dimension=dim,
        tiled=tiled,
        perm=perm,
        diagram=False,
    )
    assert_result_or_one_sentence(page, "jax.lax.")


@FORMS
@given(
    st.one_of(st.just("DP"), ARGUMENT),
    st.one_of(st.just("8"), ARGUMENT),
    st.one_of(st.just(256), ARGUMENT),
    st.one_of(st.just(64), ARGUMENT),
)
def test_the_strategy_form_gives_html(strategy, mesh, batch, features):
    page = forms.render_strategy(strategy, mesh, batch, features)
    assert_result_or_one_sentence(page, "<table")


RULES = st.one_of(
    st.sampled_from(["DP", "FSDP x TP", "TP + SP"]),
    st.dictionaries(
        st.one_of(st.sampled_from(["batch", "embed", "heads", "seq"]), st.text(max_size=5)),
        st.one_of(st.sampled_from(["data", "model", ("data", "model"), None]), ARGUMENT),
        max_size=3,
    ),
    ARGUMENT,
)


@FORMS
@given(RULES, st.one_of(st.sampled_from(["8", "4x2", "2x2x2", "3"]), ARGUMENT))
def test_the_layout_form_gives_html(rules, mesh):
    page = forms.render_transformer(rules, mesh)
    assert_result_or_one_sentence(page, "<table")


@FORMS
@given(
    st.one_of(st.sampled_from(["Llama 3 8B", "Llama 3 70B"]), ARGUMENT),
    st.one_of(st.sampled_from(["TPU v5p", "H100"]), ARGUMENT),
    st.one_of(st.sampled_from(["FSDP", "FSDP x TP x PP"]), ARGUMENT),
    st.one_of(st.sampled_from(["256", "1024"]), ARGUMENT),
    st.one_of(st.just(1024), ARGUMENT),
    st.one_of(st.just("4096"), ARGUMENT),
)
def test_the_sizing_form_gives_html(model, chip, layout, chips, batch, seq):
    page = forms.render_sizing(model, chip, layout, chips, batch, seq)
    assert_result_or_one_sentence(page, "<table")


class TypedInt(str):
    """What a form passes, but its own int() fails: only the checked count may be used."""

    def __int__(self):
        raise RuntimeError("int")


@FORMS
@given(
    st.one_of(st.sampled_from(["Llama 3 8B", "Llama 3 70B"]), ARGUMENT),
    st.one_of(st.sampled_from(["H100", "TPU v5e"]), ARGUMENT),
    st.one_of(st.sampled_from(["TP", "DP x TP", "CP x TP", "FSDP"]), ARGUMENT),
    st.one_of(st.sampled_from(["8", "16", "32"]), st.builds(TypedInt, st.just("8")), ARGUMENT),
    st.one_of(st.sampled_from(["32", "2147483647"]), ARGUMENT),
)
def test_the_serving_form_gives_html(model, chip, layout, chips, batch):
    page = serving_form.render_serving(model, chip, layout, chips, batch)
    assert_result_or_one_sentence(page, "<table")


# The exercise checkers, given code that fails in every way a reader's can.


def _raises_assert(m, k, n):
    assert m < 0


def _raises_not_implemented(m, k, n):
    raise NotImplementedError


def _exits(m, k, n):
    sys.exit()


def _exits_with_text(m, k, n):
    sys.exit("bye")


def _raises_huge(m, k, n):
    raise ValueError(10**5000)  # its str() fails: more than 4300 digits


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no words")


def _raises_unprintable(m, k, n):
    raise Unprintable


def _raises_interrupt(m, k, n):
    raise KeyboardInterrupt  # from the reader's code, not the reader's keyboard


@pytest.mark.parametrize(
    "reader, kind",
    [
        (_raises_assert, "AssertionError"),
        (_raises_not_implemented, "NotImplementedError"),
        (_exits, "SystemExit"),
        (_exits_with_text, "SystemExit (bye)"),
        (_raises_huge, "ValueError"),
        (_raises_unprintable, "Unprintable"),
        (_raises_interrupt, "KeyboardInterrupt"),
    ],
)
def test_any_error_of_the_readers_is_a_verdict_naming_its_line(reader, kind):
    verdict = exercises.ch12_intensity(reader)
    line = reader.__code__.co_firstlineno + 1
    assert not verdict.ok and verdict.judged
    assert verdict.message.startswith(f"Your code raised {kind}")
    assert f"at line {line} (`" in verdict.message and "\n" not in verdict.message


def test_a_call_with_the_wrong_answers_is_a_verdict():
    assert "takes 1 answer (gram)" in exercises.ch03_gram().message
    assert "takes 2 answers" in exercises.ch02_predict(1, 2, 3).message


def test_a_failure_of_the_checker_itself_is_not_blamed_on_the_reader(monkeypatch):
    """The checker's own code fails (here: a helper that divides by zero), not the reader's."""
    import book.exercises.arrays

    monkeypatch.setattr(
        book.exercises.arrays, "_mesh_2x4", functools.partial(operator.truediv, 1, 0)
    )
    verdict = exercises.ch02_predict((16, 1, 4), 1)
    assert not verdict.ok and not verdict.judged
    assert verdict.message.startswith("The checker itself failed with ZeroDivisionError")
    assert "not a verdict on your code" in verdict.message
    assert repr(verdict).startswith("Not checked: ")


def checker_threads():
    return [t for t in threading.enumerate() if t.name.startswith("checker ")]


def wait_for_no_checker_thread(seconds=10):
    deadline = time.monotonic() + seconds
    while checker_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not checker_threads()


def test_a_python_loop_is_stopped_at_the_time_limit(monkeypatch):
    monkeypatch.setattr(core, "TIME_LIMIT", 1.0)

    def spins(m, k, n):
        while True:
            pass

    start = time.monotonic()
    verdict = exercises.ch12_intensity(spins)
    assert time.monotonic() - start < 30  # a bound for a loaded machine, not a timing
    assert not verdict.ok and "still ran after 1 s" in verdict.message
    assert re.search(r"at line \d+ \(`(while True:|pass)`\)", verdict.message), verdict.message
    assert "so it was stopped" in verdict.message
    wait_for_no_checker_thread()


def test_a_long_sleep_is_named_as_not_stoppable(monkeypatch):
    monkeypatch.setattr(core, "TIME_LIMIT", 0.5)
    monkeypatch.setattr(core, "_GRACE", 0.5)

    def sleeps(m, k, n):
        time.sleep(3)

    verdict = exercises.ch12_intensity(sleeps)
    assert not verdict.ok and "cannot be stopped from Python" in verdict.message
    assert "time.sleep(3)" in verdict.message
    wait_for_no_checker_thread()  # the sleep ends, and the pending stop ends the thread


SPIN = """
import os
import book.devices
book.devices.setup(8)
import jax
import book.exercises.core as core
from book import exercises
core.TIME_LIMIT = 2.0

def gram(a):
    return jax.lax.while_loop(lambda c: c.sum() > -1e30, lambda c: c + 1.0, a.T @ a)

print("VERDICT", repr(exercises.ch03_gram(gram)), flush=True)
print("AFTER", jax.numpy.arange(3).sum(), flush=True)
os._exit(0)
"""


def test_a_compiled_loop_that_never_ends_still_gets_a_verdict():
    """In a process of its own: the loop keeps its devices busy until that process ends."""
    done = subprocess.run([sys.executable, "-c", SPIN], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    verdict = next(line for line in done.stdout.splitlines() if line.startswith("VERDICT"))
    assert "Not yet: The check still ran after 2 s inside JAX" in verdict
    assert "cannot be stopped from Python" in verdict and "restart the kernel" in verdict
    assert "AFTER 3" in done.stdout  # the kernel still computes


@pytest.fixture
def readers_settings():
    """What a reader may have set for the whole notebook before calling a checker."""
    changed = {
        "jax_numpy_rank_promotion": "raise",
        "jax_disable_jit": True,
        "jax_debug_nans": True,
        "jax_default_matmul_precision": "bfloat16",
    }
    before = {name: getattr(jax.config, name) for name in changed}
    for name, value in changed.items():
        jax.config.update(name, value)
    jax.set_mesh(jax.make_mesh((2, 4), ("rows", "cols"), axis_types=(AxisType.Explicit,) * 2))
    try:
        yield
    finally:
        jax.set_mesh(None)
        for name, value in before.items():
            jax.config.update(name, value)


def test_checkers_run_under_the_books_settings(readers_settings, monkeypatch):
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    gram = jax.jit(lambda a: a.T @ a, out_shardings=NamedSharding(mesh, P("x", None)))

    def mlp(x, w1, w2):
        return jnp.matmul(jnp.maximum(x @ w1, 0), w2, out_sharding=P("data", None))

    def predict_types():
        return exercises.ch04_predict_types(
            P("model", "data"), P("data", "model"), P("data", "model"), {"concatenated", "sliced"}
        )

    for verdict in (
        exercises.ch02_predict((16, 1, 4), 1),
        exercises.ch03_gram(gram),
        exercises.ch04_mlp(mlp),
        predict_types(),
    ):
        assert verdict.ok, verdict
    with pytest.raises(ValueError):  # the reader's own setting still holds outside the checker
        jnp.ones((2, 3)) + jnp.ones(3)


@pytest.mark.parametrize(
    "flags",
    [
        ["--out", "/no/such/folder/BENCHMARKS.md"],
        ["--out", "/proc/BENCHMARKS.md"],
        ["--out", "/"],
        ["--out", "x" * 5000],
        ["--out", "/dev/stdout"],
        ["--out", "loop.md"],
        ["--out", "dangling.md"],
        ["--one", "/no/such/notebook.ipynb"],
        ["--one", __file__],
        ["--one", "not-json.ipynb"],
        ["--one", "no-cells.ipynb"],
    ],
    ids=[
        "missing folder", "proc", "a folder", "too long", "a terminal", "a link to itself",
        "a link to nowhere", "no notebook", "a .py",
        "not JSON", "no cells",
    ],
)  # fmt: skip
def test_a_bad_flag_to_the_benchmark_is_refused_before_any_timing(flags, tmp_path):
    """Refused by argparse in one line, not by a traceback after minutes of chapters."""
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"
    (tmp_path / "not-json.ipynb").write_text("cells")
    (tmp_path / "no-cells.ipynb").write_text("{}")
    (tmp_path / "loop.md").symlink_to("loop.md")
    (tmp_path / "dangling.md").symlink_to("/no/such/folder/BENCHMARKS.md")
    done = subprocess.run(
        [sys.executable, str(bench), *flags],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2 and not done.stdout, done.stdout[-500:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("bench.py: error: argument") and len(last) < 300, done.stderr[-500:]


def test_an_abandoned_check_puts_back_what_it_recorded(monkeypatch):
    """A check stopped while it traces a shard_map leaves jax.shard_map the real one."""
    from jax.sharding import PartitionSpec as P

    monkeypatch.setattr(core, "TIME_LIMIT", 0.5)
    monkeypatch.setattr(core, "_GRACE", 0.5)
    real, mesh = jax.shard_map, core.line_mesh("i")

    def ring_sum(x):
        def body(b):
            time.sleep(3)  # one native call while the checker traces
            return b

        return jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)

    verdict = exercises.ch05_ring_sum(ring_sum)
    assert not verdict.ok and "cannot be stopped from Python" in verdict.message
    assert jax.shard_map is real
    wait_for_no_checker_thread()
    assert jax.shard_map is real


def test_an_answer_that_patches_numpy_jax_logging_or_limits_changes_nothing_after():
    import logging
    import resource

    real = (np.allclose, jnp.allclose)
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    level = logging.getLogger("jax").level

    def ring_sum(x):
        np.allclose = lambda *a, **k: True
        jnp.allclose = lambda *a, **k: jnp.array(True)
        logging.getLogger("jax").setLevel(logging.CRITICAL)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit[0], 512), limit[1]))
        jax.monitoring.register_event_listener(lambda *a, **k: None)
        return None

    exercises.ch05_ring_sum(ring_sum)
    assert (np.allclose, jnp.allclose) == real
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == limit
    assert logging.getLogger("jax").level == level
