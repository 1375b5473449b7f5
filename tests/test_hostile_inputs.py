"""A hostile or clumsy reader, second round: every public function of book's analysis and display
modules, given wrong kinds of things, sizes no machine holds, nan and infinities, numbers of
400 digits, negative sizes, containers that hold themselves, texts where lists belong, lists
where dicts belong and pipes where files belong.

Each call ends one of two ways: a result that is right for odd but valid input, or a
``ReaderError`` whose message is one sentence. Never another exception, never a hang, never a
number that only looks like a result. (The spec parser, forms and checkers have their own
tests in test_hostile.py and test_hostile_checkers.py.)
"""

import contextlib
import math
import os
import signal
import subprocess
import threading
import time
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hostile_values import Unprintable, Unreadable, holding_itself, impostor, lying, nested
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from book import (
    checks,
    cost,
    data,
    devices,
    display,
    hlo,
    jobs,
    models,
    shards,
    sizing,
    slurm,
    specs,
    timing,
    trace,
    validate,
)
from book.errors import ReaderError

SOME = settings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([10**400, -(10**400), 2**64, -1, 0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.5, 1e308 * 10]),
    st.text(max_size=6),
    st.sampled_from(["[1, 2]", "8", "", "x"]),
    st.binary(max_size=4),
    st.lists(st.text(max_size=2), max_size=3),
    st.lists(st.lists(st.integers(-3, 3), max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(-3, 3), max_size=2),
    st.sets(st.integers(-3, 3), max_size=2),
    st.sampled_from(["list", "dict", "nested"]).map(holding_itself),
    st.builds(object),
    st.builds(Unprintable),
    st.sampled_from([1 + 2j, Fraction(1, 3)]),
    st.builds(np.float32, st.floats(width=32)),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda: np.array([object(), 1], dtype=object)),
    st.builds(np.array, st.integers(-3, 9)),
    st.builds(np.arange, st.integers(0, 5)),
)


def one_sentence(err: ReaderError) -> str:
    message = str(err)
    assert message and "\n" not in message and message.endswith("."), message
    assert len(message) < 500, message
    return message


def result_or_sentence(call):
    """``call()``'s result, or None after checking its refusal is one sentence."""
    try:
        return call()
    except ReaderError as err:
        one_sentence(err)
        return None


def with_one_odd(args: tuple, position: int, odd) -> tuple:
    return args[:position] + (odd,) + args[position + 1 :]


# validate.describe: the words every refusal quotes a value with ---------------------------


@SOME
@given(ODD)
def test_describe_never_fails_and_never_recurses(value):
    for shown in (
        validate.describe(value),
        validate.describe([value, value]),
        validate.kind(value),
    ):
        assert isinstance(shown, str) and "\n" not in shown and len(shown) <= 200


@pytest.mark.parametrize("kind", ["list", "dict", "nested"])
def test_a_container_holding_itself_is_named_by_its_type(kind):
    assert validate.describe(holding_itself(kind)) in ("a list", "a dict")


def test_a_jnp_scalar_is_the_number_it_holds():
    assert validate.whole(jnp.int32(8), "n") == 8
    assert validate.number(jnp.float32(0.5), "x") == 0.5
    with pytest.raises(ReaderError):
        validate.whole(jnp.float32(8), "n")


# Subclasses of built-in types whose own methods fail: read for what they hold ------------


def test_a_subclass_whose_methods_fail_is_read_for_what_it_holds():
    assert validate.sizes(lying("tuple", (8, 4)), "shape") == (8, 4)
    assert validate.sizes(lying("list", [8]), "shape") == (8,)
    assert validate.text(lying("text", " x "), "the name", example="'x'") == " x "
    assert validate.seconds(lying("number", 60.0), "timeout") == 60.0
    assert validate.seconds(np.array(0.5), "timeout") == 0.5  # a 0-d array is the number
    assert timing.format_seconds(lying("number", 0.5)) == timing.format_seconds(0.5)
    assert specs.parse_mesh_shape(lying("text", "2x4")) == (2, 4)
    assert specs.parse_axis_names(lying("text", "data, model")) == ("data", "model")
    assert specs.parse_partition_spec(lying("text", "P('data')")) == P("data")
    specs.check_mesh(lying("list", [2, 4]), lying("tuple", ("a", "b")), 8)
    specs.check_sharding((8, 4), lying("dict", {"data": 8}), lying("text", "P('data')"))
    assert specs.spec_text(lying("tuple", ("data", None))) == "P('data', None)"
    table = display.table(lying("list", ["op"]), lying("list", [lying("list", ["x"])]))
    assert "x" in table.text
    ring = display.ring_diagram(lying("tuple", ("a", "b")), groups=lying("list", [0, 0]))
    assert "a" in ring.text
    before = display.before_after_table(lying("list", [np.ones(1)]), [np.zeros(1)])
    assert "device 0" in before.text
    program = jax.jit(lambda x: x + 1).lower(1.0).compile()
    assert display.hlo_graph(program, title=lying("text", "t")).text.startswith("t\n")

    class Unformatted(str):
        def __format__(self, spec):
            raise RuntimeError("format")

    assert display.styled(Unformatted("<b>x</b>")).endswith("<b>x</b>")


def test_data_fields_folders_and_indices_are_read_for_what_they_hold(tmp_path):
    source = data.write(lying("text", str(tmp_path / "d")), x=np.arange(12.0).reshape(4, 3))
    assert data.Source(lying("text", str(tmp_path / "d"))).num_examples == 4
    np.testing.assert_array_equal(source.read(lying("text", "x"), [1]), [[3.0, 4.0, 5.0]])
    batch = data.Batch(source, lying("text", "x"), [2, 3])
    assert batch.read(lying("tuple", (slice(0, 1),))).tolist() == [[6.0, 7.0, 8.0]]
    assert batch.read(lying("list", [slice(1, 2)])).tolist() == [[9.0, 10.0, 11.0]]


@pytest.mark.parametrize("name", ["x" * 100_000, "a\nb", "/" + "y" * 300 + "/z"])
def test_a_long_or_multiline_folder_is_quoted_short_on_one_line(tmp_path, name):
    with contextlib.chdir(tmp_path):
        with pytest.raises(ReaderError) as caught:
            data.Source(name)
        one_sentence(caught.value)
        result_or_sentence(lambda: data.write(name, x=np.arange(3.0)))


def test_layouts_perms_and_models_read_subclasses_or_refuse_in_one_sentence():
    from book import layouts, residuals
    from book.forms import collective

    rules = {"batch": "data", "embed": None}
    assert layouts.check(lying("dict", rules), lying("text", "8")).rules
    assert collective.parse_perm(lying("text", "shift"), 4) == ((0, 1), (1, 2), (2, 3))
    for call in (
        lambda: models.forward(lying("dict", PARAMS), X),
        lambda: residuals.parse(lying("list", ["f32[2] x"])),
        lambda: residuals.parse(8),
        lambda: residuals.total_bytes([1, 2]),
        lambda: residuals.total_bytes(lying("list", [])),
        lambda: residuals.saved(None, 1.0),
    ):
        result_or_sentence(call)
    (found,) = residuals.parse(lying("text", "f32[512,16] from the argument x"))
    assert found.nbytes == 512 * 16 * 4 and residuals.total_bytes((found,)) == found.nbytes
    with pytest.raises(ReaderError):  # a size of 5,000 digits is no printout's
        residuals.parse("f32[" + "9" * 5000 + "] x")


@pytest.mark.parametrize(
    "call",
    [
        lambda: validate.seconds(np.timedelta64(8, "s"), "timeout"),
        lambda: display.table(["op"], [[lying("text", "")]]),
        lambda: display.verdict_html(True, lying("text", "x")),
        lambda: display.table(["a"], [[np.ones((2, 2))]]),
        lambda: display.table(["a"], [[np.zeros(0)], [""]]),
        lambda: display.ring_diagram(["a"], groups=[lying("text", "chip")]),
        lambda: hlo.collectives(lying("text", "HloModule m")),
        lambda: trace.read(lying("text", "no/such/trace.json.gz")),
    ],
)
def test_odd_values_inside_tables_texts_and_paths_give_a_result_or_one_sentence(call):
    result_or_sentence(call)


TIMELINE = [trace.Op(0, "all-gather.1", "jit_f", 0.0, 2.0), trace.Op(0, "dot", "jit_f", 2.0, 1.0)]
BLOCKS = [np.array([1.0]), np.array([2.0])]


@pytest.mark.parametrize(
    "call",
    [
        lambda: display.table(dict, [["a"]]),  # a class where a list belongs
        lambda: display.table(["a"], list),
        lambda: display.outputs_html(tuple),
        lambda: display.timeline(list, {}),
        lambda: display.before_after_table(BLOCKS, BLOCKS, headers=lying("list", ["a", "b"])),
        lambda: display.collective_diagram(
            BLOCKS, BLOCKS, reduce="sum", groups=lying("list", [[0, 1]])
        ),
        lambda: display.ring_diagram(["a", "b"], groups=np.array("a")),  # a 0-d array
        lambda: display.styled(nested()),
        lambda: display.timeline(TIMELINE, {}, title="\udcff"),  # bytes that are no UTF-8
        lambda: display.table(["a"], [[1]], note="\ud800"),
    ],
)
def test_classes_lying_lists_0d_arrays_and_surrogates_give_a_result_or_one_sentence(call):
    import matplotlib.pyplot as plt

    got = result_or_sentence(call)
    if isinstance(got, plt.Figure):
        plt.close(got)


def test_a_workers_base_environment_is_read_for_what_it_holds():
    from book import multihost

    env = multihost.worker_env(0, 1, 1, "127.0.0.1:1", base=lying("dict", {"A": "1"}))
    assert env["A"] == "1" and env["JAX_PROCESS_ID"] == "0"


@pytest.mark.parametrize(
    "base", [{"PYTHONPATH": None}, {"A": 1}, {1: "a"}, {"A": "x\0y"}, {"": "x"}, {"A=B": "x"}]
)
def test_a_workers_base_environment_of_other_than_text_is_refused(base):
    from book import multihost

    with pytest.raises(ReaderError) as caught:
        multihost.worker_env(0, 1, 1, "127.0.0.1:1", base=base)
    one_sentence(caught.value)


# book.cost: every formula takes sizes, bytes and counts, or says which is wrong -------------

FORMULAS = [
    (cost.matmul_flops, (2, 3, 4, 5)),
    (cost.all_gather_bytes, (800, 8)),
    (cost.reduce_scatter_bytes, (800, 8)),
    (cost.all_reduce_bytes, (800, 8)),
    (cost.all_to_all_bytes, (6400, 8)),
    (cost.all_to_all_ring_link_bytes, (6400, 8, True)),
    (cost.collective_permute_bytes, (800,)),
    (cost.ring_steps, ("all-reduce", 8)),
    (cost.collective_seconds, (1400.0, 14, 100.0, 1e-6)),
]


@SOME
@given(st.sampled_from(FORMULAS), st.integers(0, 3), ODD)
def test_cost_formulas_refuse_what_is_not_a_size(formula, position, odd):
    function, args = formula
    position %= len(args)
    got = result_or_sentence(lambda: function(*with_one_odd(args, position, odd)))
    if got is not None:  # an odd value that is a valid size: the answer is a real number
        assert isinstance(got, (int, float)) and not isinstance(got, bool)
        assert math.isfinite(got) and got >= 0


@pytest.mark.parametrize("bad", [math.nan, -1, -0.5, math.inf, "800", None, 10**400])
def test_cost_never_answers_nan_or_negative_sizes(bad):
    for call in (
        lambda: cost.all_reduce_bytes(bad, 8),
        lambda: cost.all_gather_bytes(800, bad),
        lambda: cost.matmul_flops(bad, 3, 4),
        lambda: cost.collective_seconds(bad, 1, 1e9, 1e-6),
        lambda: cost.collective_seconds(100, 1, bad, 1e-6),
    ):
        with pytest.raises(ReaderError) as caught:
            call()
        one_sentence(caught.value)


def test_ring_bytes_takes_only_a_row_of_collectives():
    with pytest.raises(ReaderError, match="book.hlo.collectives"):
        cost.ring_bytes({"op": "all-gather", "bytes": 8})


# book.checks: a product is right, wrong, or cannot be checked ------------------------------

A = np.arange(12, dtype=np.float32).reshape(4, 3)
B = np.arange(15, dtype=np.float32).reshape(3, 5)


@SOME
@given(st.integers(0, 2), ODD)
def test_assert_product_checks_or_refuses(position, odd):
    args = with_one_odd((A @ B, A, B), position, odd)
    try:
        error = checks.assert_product(*args)
    except AssertionError as err:  # a wrong result: the assertion's own job
        assert "\n" not in str(err)
        return
    except ReaderError as err:
        one_sentence(err)
        return
    assert 0 <= error <= checks.tolerance(3)


@pytest.mark.parametrize("result", [A @ B * np.nan, np.where(A @ B > 50, np.inf, A @ B)])
def test_assert_product_fails_a_product_that_is_not_finite(result):
    with pytest.raises(AssertionError, match="not a finite number"):
        checks.assert_product(result, A, B)


def test_a_product_past_float64_is_refused_not_passed():
    a, b = np.full((1, 2), 1e300), np.full((2, 1), 1e10)  # finite, their product is not
    for check in (checks.assert_product, checks.product_error):
        with pytest.raises(ReaderError, match="overflows float64") as caught:
            check(np.array([[7.0]]), a, b)
        one_sentence(caught.value)


@pytest.mark.parametrize("size", [1e-18, 1e-20])
def test_a_right_float32_product_of_tiny_values_passes_and_a_wrong_one_does_not(size):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((8, 16)) * size).astype(np.float32)
    b = (rng.standard_normal((16, 8)) * size).astype(np.float32)
    checks.assert_product(np.asarray(jnp.asarray(a) @ jnp.asarray(b)), a, b)  # subnormals flushed
    with pytest.raises(AssertionError, match="differs from A @ B"):  # still judged: 1e4 too large
        checks.assert_product(np.asarray(a, np.float64) @ b * 1e4 + 1e-30, a, b)


def test_assert_product_names_a_complex_result_as_such():
    with pytest.raises(ReaderError, match="must hold real numbers, not complex ones"):
        checks.assert_product(A @ B + 0j, A, B)


@pytest.mark.parametrize("rtol", [math.nan, math.inf, -1e-5, 0, 2, "1e-5", True])
def test_assert_product_refuses_a_tolerance_that_checks_nothing(rtol):
    with pytest.raises(ReaderError):
        checks.assert_product(A @ B, A, B, rtol=rtol)


# book.data: folders, fields, rows and what build returns -----------------------------------


@pytest.fixture
def source(tmp_path):
    return data.write(tmp_path / "d", x=np.arange(48, dtype=np.float32).reshape(16, 3))


@SOME
@given(ODD)
def test_source_reads_only_example_numbers(source, rows):
    got = result_or_sentence(lambda: source.read("x", rows))
    if got is not None:
        wanted = np.asarray(rows).ravel()
        assert got.shape == (wanted.size, 3) and (wanted >= 0).all()


@SOME
@given(st.integers(0, 1), ODD)
def test_source_read_refuses_fields_and_rows_it_does_not_have(source, position, odd):
    result_or_sentence(lambda: source.read(*with_one_odd(("x", [1, 2]), position, odd)))


def test_row_minus_one_is_no_example(source):
    with pytest.raises(ReaderError, match="from 0 to 15"):
        source.read("x", [-1])


@SOME
@given(ODD)
def test_write_refuses_what_it_cannot_store_and_keeps_what_was_there(tmp_path, odd):
    folder = tmp_path / "w"
    data.write(folder, x=np.arange(4.0), y=np.arange(4))
    got = result_or_sentence(lambda: data.write(folder, x=odd))
    if got is None:  # refused: both fields as they were
        np.testing.assert_array_equal(np.load(folder / "x.npy"), np.arange(4.0))
        np.testing.assert_array_equal(np.load(folder / "y.npy"), np.arange(4))
    if isinstance(odd, str) and (os.path.isabs(odd.strip()) or ".." in odd):
        return  # a path out of the test's folder is a valid path: not written to here
    with contextlib.chdir(tmp_path):  # an odd folder name that is a valid path lands here
        result_or_sentence(lambda: data.write(odd, x=np.arange(4.0)))


def test_a_write_the_source_would_refuse_leaves_the_folder_as_it_was(tmp_path):
    data.write(tmp_path, x=np.arange(10.0), z=np.arange(10))
    with pytest.raises(ReaderError, match="already holds field 'z'"):
        data.write(tmp_path, x=np.arange(5.0))
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), np.arange(10.0))
    assert sorted(os.listdir(tmp_path)) == ["x.npy", "z.npy"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are a POSIX thing")
def test_a_field_that_is_a_pipe_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "x.npy")
    found = {}

    def open_it():
        try:
            data.Source(tmp_path)
        except ReaderError as err:
            found["said"] = one_sentence(err)

    reader = threading.Thread(target=open_it, daemon=True)
    reader.start()
    reader.join(30)
    if reader.is_alive():  # unblock the reader before failing: open the pipe for writing
        os.close(os.open(tmp_path / "x.npy", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("book.data.Source waited on a named pipe")
    assert "not a regular file" in found["said"]


@pytest.fixture(scope="module")
def rows_sharding():
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    return NamedSharding(mesh, P("data"))


@SOME
@given(ODD)
def test_a_build_that_returns_no_batch_is_named(source, rows_sharding, odd):
    loader = data.Loader(source, 8, rows_sharding, lambda batch, sharding: odd)
    with pytest.raises(ReaderError) as caught:
        next(loader.epoch(0))
    assert "build returned" in one_sentence(caught.value)


def test_a_build_that_ignores_its_sharding_is_named(source, rows_sharding):
    one_device = jax.devices()[0]
    loader = data.Loader(
        source, 8, rows_sharding, lambda b, s: jax.device_put(b.read(), one_device)
    )
    with pytest.raises(ReaderError, match="laid out otherwise"):
        next(loader.epoch(0))


@SOME
@given(st.integers(0, 3), ODD)
def test_the_loader_and_its_helpers_refuse_in_one_sentence(source, rows_sharding, position, odd):
    def build(batch, sharding):
        return jax.make_array_from_callback(batch.shape, sharding, batch.read)

    args = with_one_odd((source, 8, rows_sharding, build), position, odd)
    result_or_sentence(lambda: data.Loader(*args))
    result_or_sentence(lambda: data.epoch_order(odd, 0, 0))
    with pytest.raises((AssertionError, ReaderError)):  # an assertion, or one sentence
        data.check_epoch(odd, 16)
    result_or_sentence(lambda: data.process_slice(rows_sharding, odd))
    result_or_sentence(lambda: data.Batch(source, "x", odd))


# book.hlo and book.display: programs, rows, tables and pictures ---------------------------


@pytest.fixture(scope="module")
def programs():
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    x = jax.device_put(np.ones((16, 4), np.float32), NamedSharding(mesh, P("x")))
    lowered = jax.jit(lambda a: a.sum(0)).lower(x)
    return lowered, lowered.compile()


def test_a_lowered_programs_text_is_not_read_as_having_no_collectives(programs):
    lowered, compiled = programs
    assert [r.op for r in hlo.collectives(compiled)] == ["all-reduce"]
    for reader in (hlo.collectives, hlo.instructions, hlo.dataflow):
        with pytest.raises(ReaderError, match="compile"):
            reader(lowered.as_text())


def test_stablehlo_listing_names_the_program_to_pass(programs):
    lowered, compiled = programs
    assert "@main(" in display.stablehlo_listing(lowered)
    with pytest.raises(ReaderError, match="lowered one"):
        display.stablehlo_listing(compiled)


@SOME
@given(ODD)
def test_program_readers_refuse_what_is_no_program(odd):
    for reader in (
        hlo.collectives,
        hlo.instructions,
        hlo.dataflow,
        hlo.stablehlo_main,
        display.collective_table,
        display.listing,
        display.hlo_graph,
        display.stablehlo_listing,
    ):
        result_or_sentence(lambda reader=reader: reader(odd))


@SOME
@given(ODD)
def test_rows_and_widths_are_checked(programs, odd):
    (row,) = hlo.collectives(programs[1])
    for call in (
        lambda: display.shape_text(odd),
        lambda: display.groups_text(odd),
        lambda: display.groups_text(row, odd),
        lambda: display.listing(programs[1], width=odd),
        lambda: display.listing(programs[1], ops=odd),
        lambda: cost.ring_bytes(odd),
    ):
        result_or_sentence(call)


HEADERS, ROWS = ["op", "bytes"], [["all-gather", 1024], ["all-reduce", 2048]]


@SOME
@given(st.integers(0, 3), ODD)
def test_table_takes_lists_or_says_what_it_needs(position, odd):
    args = (HEADERS, ROWS, None, None)
    headers, rows, title, note = with_one_odd(args, position, odd)
    table = result_or_sentence(lambda: display.table(headers, rows, title=title, note=note))
    if table is not None:
        assert isinstance(table.text, str) and "<table" in table.html


@pytest.mark.parametrize(
    "headers, rows",
    [("op", ROWS), (HEADERS, "rows"), ({"op": 1, "bytes": 2}, ROWS), (HEADERS, [["x"], ["y"]])],
)
def test_a_text_or_a_dict_is_not_taken_for_a_list(headers, rows):
    with pytest.raises(ReaderError):
        display.table(headers, rows)


def test_a_true_cell_says_true():
    assert "True" in display.table(["flag"], [[True]]).text


@SOME
@given(st.integers(0, 2), ODD)
def test_timeline_verdicts_and_outputs_refuse_wrong_kinds(position, odd):
    ops = [trace.Op(0, "all-gather.1", "jit_f", 0.0, 2.0), trace.Op(0, "dot", "jit_f", 2.0, 1.0)]
    args = with_one_odd((ops, {"all-gather.1": "all-gather"}, None), position, odd)
    figure = result_or_sentence(lambda: display.timeline(args[0], args[1], title=args[2]))
    if figure is not None:
        import matplotlib.pyplot as plt

        plt.close(figure)
    result_or_sentence(lambda: display.outputs_html(odd))
    result_or_sentence(lambda: display.verdict_html(odd, "x"))
    result_or_sentence(lambda: display.verdict_html(True, odd))
    assert isinstance(display.error_html(odd), str)


@SOME
@given(st.integers(0, 1), ODD)
def test_pictures_refuse_wrong_kinds(position, odd):
    blocks = [np.array([1.0]), np.array([2.0])]
    before, after = with_one_odd((blocks, blocks[::-1]), position, odd)
    result_or_sentence(lambda: display.before_after_table(before, after))
    result_or_sentence(lambda: display.collective_diagram(before, after).text)
    result_or_sentence(lambda: display.ring_diagram(odd).text)
    result_or_sentence(lambda: display.mesh_diagram(odd))
    result_or_sentence(lambda: display.shard_table(odd))


# book.models and book.timing ---------------------------------------------------------------

PARAMS = models.init(0, 4, 8, 3)
X, Y = models.synthetic_data(1, 16, 4, 3)


@SOME
@given(st.integers(0, 3), ODD)
def test_models_refuse_what_is_no_model_or_batch(position, odd):
    step = with_one_odd((PARAMS, X, Y, 0.1), position, odd)
    got = result_or_sentence(lambda: models.reference_step(*step))
    if got is not None:
        new, loss, _ = got
        assert np.isfinite(float(loss)) and set(new) == set(PARAMS)
    result_or_sentence(lambda: models.forward(*with_one_odd((PARAMS, X), position % 2, odd)))
    result_or_sentence(
        lambda: models.cross_entropy(*with_one_odd((X[:, :3], Y), position % 2, odd))
    )
    result_or_sentence(lambda: models.sgd(*with_one_odd((PARAMS, PARAMS, 0.1), position % 3, odd)))
    result_or_sentence(lambda: models.init(*with_one_odd((0, 4, 8, 3), position, odd)))
    result_or_sentence(lambda: models.synthetic_data(*with_one_odd((0, 16, 4, 3), position, odd)))
    result_or_sentence(lambda: models.param_count(odd))


def test_a_learning_rate_of_nan_does_not_turn_the_model_into_nan():
    with pytest.raises(ReaderError, match="learning_rate"):
        models.sgd(PARAMS, PARAMS, math.nan)


# An array or a number where a dtype belongs, or a floating type NumPy has and JAX has not
# (float128, where np.longdouble is wider than float64).
NOT_JAX_DTYPES = [jnp.array(1.0), np.array([1.0]), np.float32(1)] + [np.longdouble] * (
    np.dtype(np.longdouble).itemsize > 8
)


@pytest.mark.parametrize("dtype", NOT_JAX_DTYPES, ids=repr)
def test_a_dtype_jax_cannot_make_is_refused(dtype):
    for call in (
        lambda: models.init(0, 4, 8, 3, dtype),
        lambda: models.synthetic_data(0, 16, 4, 3, dtype),
    ):
        with pytest.raises(ReaderError, match="dtype") as caught:
            call()
        one_sentence(caught.value)


def test_labels_beyond_the_classes_are_refused():
    with pytest.raises(ReaderError, match="classes"):
        models.cross_entropy(X[:, :3], Y + 3)


@SOME
@given(ODD)
def test_format_seconds_shows_a_number_or_refuses(odd):
    shown = result_or_sentence(lambda: timing.format_seconds(odd))
    if shown is not None:
        assert shown.endswith(("µs", "ms", " s")) and "\n" not in shown


@SOME
@given(st.sampled_from(["warmup", "runs"]), ODD)
def test_measure_refuses_counts_it_cannot_run(name, odd):
    got = result_or_sentence(lambda: timing.measure(lambda: None, **{name: odd, "runs": 2}))
    if got is not None:
        assert got.median >= 0


# book.specs, book.sizing and book.trace --------------------------------------------------


def test_duplicate_axis_names_are_refused():
    with pytest.raises(specs.SpecError, match="appears twice"):
        specs.check_mesh((2, 4), ("data", "data"), 8)


@SOME
@given(st.integers(0, 2), ODD)
def test_spec_checks_refuse_in_one_sentence(position, odd):
    mesh = {"data": 2, "model": 4}
    result_or_sentence(
        lambda: specs.check_mesh(*with_one_odd(((2, 4), ("a", "b"), 8), position, odd))
    )
    result_or_sentence(
        lambda: specs.check_sharding(*with_one_odd(((8, 4), mesh, P("data")), position, odd))
    )
    result_or_sentence(lambda: specs.spec_text(odd))
    result_or_sentence(lambda: specs.names_text(odd))


@SOME
@given(st.sampled_from(["dp", "fsdp", "tp", "global_batch", "seq", "remat"]), ODD)
def test_the_sizing_calculator_refuses_in_one_sentence(name, odd):
    kwargs = {"global_batch": 8, "seq": 128, name: odd}
    plan = result_or_sentence(lambda: sizing.plan(sizing.PRESETS["Llama 3 8B"], **kwargs))
    if plan is not None:
        assert all(math.isfinite(v) and v >= 0 for v in plan.memory.values())


@SOME
@given(ODD)
def test_trace_paths_are_read_or_refused(tmp_path, odd):
    result_or_sentence(lambda: trace.read(odd))
    result_or_sentence(lambda: trace.trace_file(odd))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are a POSIX thing")
def test_a_trace_that_is_a_pipe_is_named(tmp_path):
    os.mkfifo(tmp_path / "t.json.gz")
    with pytest.raises(ReaderError, match="not a regular file"):
        trace.read(tmp_path / "t.json.gz")


# book.sizing.serve and what chapter 20 calls of it ----------------------------------------


class StrangeText(str):
    """A text whose own methods fail: only what the text holds may be read."""

    def strip(self, *args):
        raise RuntimeError("strip")

    def __eq__(self, other):
        raise RuntimeError("eq")

    def __hash__(self):
        raise RuntimeError("hash")


def finite_python_numbers(*values):
    return all(type(v) in (int, float) and math.isfinite(v) and v >= 0 for v in values)


@SOME
@given(
    st.sampled_from(
        [
            "batch",
            "context",
            "dp",
            "fsdp",
            "cp",
            "tp",
            "param_dtype",
            "cache_dtype",
            "compute_dtype",
            "hardware",
        ]
    ),
    st.one_of(ODD, st.builds(StrangeText, st.sampled_from(["8", "bfloat16", "H100"]))),
)
def test_serve_and_its_decode_step_refuse_in_one_sentence(name, odd):
    kwargs = {"batch": 8, "context": 1024}
    if name != "hardware":
        kwargs[name] = odd
    hardware = odd if name == "hardware" else "H100"
    plan = result_or_sentence(lambda: sizing.serve(sizing.PRESETS["Llama 3 8B"], **kwargs))
    step = plan and result_or_sentence(lambda: plan.decode_seconds(hardware))
    if step is not None:
        assert finite_python_numbers(*plan.memory.values(), *plan.read.values(), plan.flops)
        assert finite_python_numbers(step.bound, step.serial, step.per_user, step.per_chip)


@SOME
@given(st.integers(0, 2), st.one_of(ODD, st.builds(StrangeText, st.just("int8"))))
def test_kv_cache_bytes_refuses_in_one_sentence(position, odd):
    args = with_one_odd((sizing.PRESETS["Llama 3 8B"], 8, "int8"), position, odd)
    found = result_or_sentence(lambda: sizing.kv_cache_bytes(*args))
    assert found is None or (type(found) is int and found >= 0)


@pytest.mark.parametrize(
    "number", [np.int64, np.int32, np.int16, np.int8, jnp.int32], ids=lambda t: t.__name__
)
def test_a_model_of_numpy_or_jax_integers_plans_as_one_of_python_integers(number):
    # Stored as given, they overflowed: int32 products wrapped, int8 ones raised.
    fields = {"layers": 2, "d_model": 64, "d_ff": 96, "heads": 4, "kv_heads": 2, "vocab": 96}
    python = sizing.Transformer(**fields)
    odd = sizing.Transformer(**{k: number(v) for k, v in fields.items()}, gated=np.bool_(True))
    assert all(type(getattr(odd, k)) is int for k in [*fields, "head_dim"])
    assert odd == python and sizing.param_count(odd) == sizing.param_count(python)
    big = sizing.Transformer(2**31 - 1, 8, 8, 8, 8, 2**31 - 1)
    assert sizing.param_count(big) == sizing.param_count(
        sizing.Transformer(np.int32(2**31 - 1), 8, 8, 8, 8, np.int32(2**31 - 1))
    )
    plan = sizing.serve(odd, batch=np.int64(8), context=jnp.int32(64), tp=np.int8(2))
    assert plan == sizing.serve(python, batch=8, context=64, tp=2)


def test_a_chip_of_numpy_numbers_gives_python_times_and_absurd_rates_are_refused():
    h100 = sizing.HARDWARE["H100"]
    odd = sizing.Hardware(
        "odd",
        np.float32(989e12),
        jnp.float32(80e9),
        h100.fast,
        h100.slow,
        np.int64(8),
        "s",
        np.float32(3.35e12),
    )
    assert all(type(v) is float for v in (odd.peak_flops, odd.hbm_bytes, odd.hbm_bandwidth))
    assert type(odd.domain) is int
    step = sizing.serve(sizing.PRESETS["Llama 3 8B"], batch=8, context=64).decode_seconds(odd)
    assert finite_python_numbers(step.bound, step.per_chip)
    for field in ("peak_flops", "hbm_bandwidth", "hbm_bytes"):
        with pytest.raises(sizing.SizingError, match="at least 1"):
            sizing.Hardware(**{**h100.__dict__, field: 1e-300})


def test_a_text_whose_own_methods_fail_is_read_by_what_it_holds():
    assert validate.whole(StrangeText("8"), "n", text=True) == 8
    assert validate.choice(StrangeText("b"), ["a", "b"], "a letter") == "b"
    plan = sizing.serve(sizing.PRESETS["Llama 3 8B"], batch=8, context=64)
    assert plan.decode_seconds(StrangeText("H100")) == plan.decode_seconds("H100")


# book.multihost: a script, its arguments and environment, checked before any worker starts -


class PathOf(os.PathLike):
    """A path object of the reader's own, whose ``__fspath__`` gives ``path`` or raises it."""

    def __init__(self, path):
        self.path = path

    def __fspath__(self):
        if isinstance(self.path, Exception):
            raise self.path
        return self.path


class Checked(Exception):
    """Every argument passed its check: the launch would start here."""


@pytest.fixture
def no_workers(monkeypatch, tmp_path):
    from book import multihost

    def stop():
        raise Checked

    monkeypatch.setattr(multihost, "_sweep_stale_folders", stop)
    script = tmp_path / "worker.py"
    script.write_text("print('hi')\n")
    return multihost, str(script)


@pytest.mark.parametrize(
    "script",
    [
        PathOf(RuntimeError("fspath")),
        PathOf(b"/tmp"),
        "/tmp/" + "x" * 5000,
        "/tmp/" + "y" * 300 + "/z",
        "~no_such_user_of_the_book/x.py",
        lying("text", "no/such/script.py"),
    ],
)
def test_a_script_path_that_cannot_be_read_is_refused_in_one_sentence(no_workers, script):
    multihost, _ = no_workers
    with pytest.raises(ReaderError) as caught:
        multihost.launch(script)
    one_sentence(caught.value)


@pytest.mark.parametrize(
    "args, env",
    [
        ([lying("number", 0.5), lying("text", "x")], None),
        (lying("tuple", ("a", "b")), None),
        (lying("list", ["a"]), lying("dict", {"A": "1"})),
        ([PathOf("/tmp")], {"A": PathOf("/tmp"), "B": lying("text", "2")}),
    ],
)
def test_launch_reads_subclassed_arguments_for_what_they_hold(no_workers, args, env):
    multihost, script = no_workers
    with pytest.raises(Checked):
        multihost.launch(script, args=args, env=env)
    assert multihost._check_args(args)[-1] in ("x", "b", "a", "/tmp")


@pytest.mark.parametrize(
    "args, env",
    [([PathOf(RuntimeError("fspath"))], None), ([], {"A": PathOf(RuntimeError("fspath"))})],
)
def test_launch_refuses_a_path_argument_that_cannot_be_read(no_workers, args, env):
    multihost, script = no_workers
    with pytest.raises(ReaderError) as caught:
        multihost.launch(script, args=args, env=env)
    one_sentence(caught.value)


def test_a_running_jobs_signal_and_pattern_are_checked(tmp_path):
    from book import multihost

    script = tmp_path / "waits.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    with multihost.start(script, num_processes=1, timeout=120) as job:
        job.wait_for("ready")
        assert job.signal("cont", 0) == job.signal(signal.SIGCONT, 0)
        for call in (
            lambda: job.signal("SIGNOPE"),
            lambda: job.signal(0.5),
            lambda: job.signal(lying("list", [15])),
            lambda: job.wait_for(b"ready"),
            lambda: job.wait_for("(unclosed"),
            lambda: job.wait_for(["ready"]),
            lambda: job.wait_for("x" * 5000),
        ):
            with pytest.raises(ReaderError) as caught:
                call()
            one_sentence(caught.value)
        assert job.wait_for(lying("text", "rea(dy)")).group(1) == "dy"


def test_a_slow_pattern_is_stopped_at_the_jobs_timeout(tmp_path):
    # Three wildcards over a long line that almost matches: cubic time, hours in the kernel.
    from book import linesearch, multihost

    script = tmp_path / "long_line.py"
    script.write_text("print('loss = ' * 3000, flush=True)\nimport time\ntime.sleep(60)\n")
    began = time.monotonic()
    with multihost.start(script, num_processes=1, timeout=4) as job:
        with pytest.raises(linesearch.SearchTooSlow) as caught:
            job.wait_for(r".*loss.*=.*nan")
        one_sentence(caught.value)
    assert time.monotonic() - began < 30
    assert not [p for p in children_command_lines() if "re.compile(json" in p]


def children_command_lines() -> list[str]:
    """The command lines of this process's children, read from /proc."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                parent = int(f.read().rsplit(b")", 1)[1].split()[1])
            if parent == os.getpid():
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    found.append(f.read().decode(errors="replace"))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_a_line_printed_without_its_newline_is_found(tmp_path):
    from book import multihost

    script = tmp_path / "prompt.py"
    script.write_text(
        "import sys, time\nsys.stdout.write('ready> ')\nsys.stdout.flush()\ntime.sleep(60)\n"
    )
    with multihost.start(script, num_processes=1, timeout=60) as job:
        assert job.wait_for(r"ready> $").group() == "ready> "


@pytest.mark.parametrize(
    "call",
    [
        lambda: slurm.step("srun -n 2 python x.py"),
        lambda: slurm.step(["no-such-program-of-the-book", "x"]),
        lambda: slurm.step(lying("list", ["no-such-program-of-the-book"])),
        lambda: slurm.step(["srun", None]),
        lambda: slurm.step(["srun", "a\0b"]),
        lambda: slurm.run([]),
        lambda: slurm.run(["x" * 5000]),
        lambda: slurm.time_from("x", {}, "(.*)", 1),
        lambda: slurm.time_from({"a": 1}, {}, "(.*)", 1),
        lambda: slurm.time_from({"a": subprocess.Popen}, {}, "(.*)", 1),
        lambda: hlo.instructions("HloModule m", 5),
        lambda: hlo.instructions("HloModule m", lying("text", "x")),
        lambda: devices.version_notice(lying("list", ["0.8"])),
    ],
)
def test_commands_ops_and_versions_are_checked_in_one_sentence(call):
    result_or_sentence(call)


def test_listing_ops_and_timeline_kinds_are_read_for_what_they_hold(programs):
    compiled = programs[1]
    assert display.listing(compiled, ops=lying("text", "all-reduce"))
    assert display.listing(compiled, ops=lying("tuple", (lying("text", "all-reduce"),)))
    ops = [trace.Op(0, "all-gather.1", "jit_f", 0.0, 2.0), trace.Op(0, "dot", "jit_f", 2.0, 1.0)]
    figure = display.timeline(ops, lying("dict", {"all-gather.1": lying("text", "all-gather")}))
    import matplotlib.pyplot as plt

    plt.close(figure)
    assert devices.version_notice(lying("text", "0.0.1"))  # read as the text it holds


# book.jobs: what chapter 19 passes to a batch job, checked before sbatch runs -------------


@pytest.fixture
def no_sbatch(monkeypatch, tmp_path):
    def refused(command, timeout=30):
        raise AssertionError(f"reached Slurm with {command}")

    monkeypatch.setattr(jobs.slurm, "run", refused)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sbatch").write_text("#!/bin/bash\n")
    return tmp_path


@SOME
@given(st.sampled_from(["batch_script", "script", "args", "env", "num_tasks", "timeout"]), ODD)
def test_submit_refuses_in_one_sentence_before_sbatch(no_sbatch, name, odd):
    kwargs = {"batch_script": "job.sbatch", "script": "task.py", "args": ["x"], name: odd}
    with contextlib.suppress(AssertionError):  # what passes every check reaches sbatch
        result_or_sentence(lambda: jobs.submit(**kwargs))


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"batch_script": "missing.sbatch"}, "There is no batch script"),
        ({"batch_script": "x" * 5000}, "There is no batch script"),  # too long a name
        ({"args": "--steps 12"}, "list or tuple"),
        ({"args": [Unprintable()]}, "Each argument"),
        ({"env": {"XLA_FLAGS": "a,b"}}, "comma"),
        ({"env": {"A": None}}, "None"),
        ({"env": ["A=1"]}, "mapping"),
    ],
)
def test_submit_names_what_sbatch_could_not_take(no_sbatch, kwargs, words):
    kwargs = {"batch_script": "job.sbatch", "script": "task.py", **kwargs}
    with pytest.raises(ReaderError, match=words) as err:
        jobs.submit(**kwargs)
    one_sentence(err.value)


@pytest.fixture
def no_cluster(monkeypatch):
    """A made-up job's id may be a real job of the local cluster: ask and cancel nothing."""
    monkeypatch.setattr(jobs.slurm, "job", lambda job_id: {"JobState": "PENDING"})
    monkeypatch.setattr(jobs.slurm, "cancel", lambda job_id: None)
    monkeypatch.setattr(jobs, "_task_pids", lambda job_id, script: {})


@SOME
@given(ODD)
def test_a_jobs_methods_refuse_in_one_sentence(no_cluster, tmp_path, odd):
    job = jobs.SlurmJob(7, "task.py", 2, tmp_path / "job-7.out", 5.0)
    assert result_or_sentence(lambda: job.errors(odd)) in (None, "")
    assert result_or_sentence(lambda: job.output(odd)) in (None, "")
    calls = [lambda: job.signal(odd, 5), lambda: job.wait_for(odd, 5)]
    if result_or_sentence(lambda: validate.whole(odd, "p", low=0, high=1)) is None:
        calls.append(lambda: job.wait_for("x", odd))  # a task of the job would be waited for
    for call in calls:
        with pytest.raises(ReaderError) as err:  # each refused before any wait
            call()
        one_sentence(err.value)


@pytest.mark.parametrize("pattern", ["(", "*", "[a-", "a{2,1}"])
def test_a_pattern_python_cannot_read_is_named(no_cluster, tmp_path, pattern):
    job = jobs.SlurmJob(7, "task.py", 2, tmp_path / "job-7.out", 5.0)
    with pytest.raises(ReaderError, match="regular expression") as err:
        job.wait_for(pattern)
    one_sentence(err.value)


def test_a_ring_op_is_read_for_the_text_it_holds():
    assert cost.ring_steps(lying("text", "all-gather"), 4) == 3


# Objects that lie about their type, alone or inside a container, given to every public
# function of the display, HLO, measurement and form modules in every position.
IMPOSTORS = {
    "claims int": lambda: impostor(int),
    "claims str": lambda: impostor(str),
    "claims list": lambda: impostor(list),
    "claims dict": lambda: impostor(dict),
    "claims jax.Array": lambda: impostor(jax.Array),
    "claims ndarray": lambda: impostor(np.ndarray),
    "unreadable": Unreadable,
    "in a list": lambda: [[1, impostor(int)]],
    "in a dict": lambda: {"a": Unreadable()},
}


WRAPPER = validate.impostors_refused(len).__code__


def impostor_refused_functions():
    """Every function of these modules that impostors_refused wraps, with its parameters."""
    import inspect

    from book import forms, measured
    from book.forms import collective, common, serving, sharding, strategy, transformer
    from book.forms import sizing as sizing_form

    del forms
    found = []
    from book import layouts, residuals, shards, strategies

    for module in (display, hlo, measured, collective, common, serving, sharding, strategy,
                   transformer, sizing_form, cost, sizing, data, residuals, shards, specs,
                   layouts, checks, trace, strategies, models, timing):  # fmt: skip
        for name, fn in vars(module).items():
            if getattr(fn, "__code__", None) is WRAPPER and fn.__module__ == module.__name__:
                params = inspect.signature(fn).parameters.values()
                needed = [
                    p for p in params if p.default is p.empty and p.kind == p.POSITIONAL_OR_KEYWORD
                ]
                found.append((f"{module.__name__}.{name}", fn, len(needed)))
    return found


@pytest.mark.parametrize("which", IMPOSTORS)
def test_an_object_lying_about_its_type_gets_one_sentence_anywhere(which):
    functions = impostor_refused_functions()
    assert len(functions) >= 100
    for name, fn, needed in functions:
        for position in range(needed):
            args = ["8"] * needed
            args[position] = IMPOSTORS[which]()
            try:
                fn(*args)
            except ReaderError as err:
                one_sentence(err)
            except Exception as err:  # noqa: BLE001
                pytest.fail(f"{name} with {which} at {position}: {type(err).__name__}: {err}")


def test_a_fault_of_the_books_own_still_escapes_as_it_is():
    @validate.impostors_refused
    def broken(values):
        return values["missing"]

    with pytest.raises(KeyError):
        broken({"present": 1})
    with pytest.raises(validate.WrongKind, match="claims to be a dict but is a Impostor"):
        broken(impostor(dict))


SURROGATE = "\ud800"  # no character: os.fsencode cannot write it for another program


@pytest.mark.parametrize(
    "call",
    [
        lambda s: book_multihost().launch(s, args=[SURROGATE], timeout=10),
        lambda s: book_multihost().launch(s, env={"X": SURROGATE}, timeout=10),
        lambda s: book_multihost().launch(s, env={SURROGATE: "1"}, timeout=10),
        lambda s: book_multihost().launch(s, env={"X": 10**5000}, timeout=10),
        lambda s: slurm.run(["echo", SURROGATE]),
        lambda s: slurm.step(["srun", SURROGATE]),
        lambda s: slurm.tasks("0: hi", 2**31 - 1),
        lambda s: slurm.step(["srun", "true"], num_tasks=10**6),
    ],
)
def test_texts_no_program_can_take_and_absurd_task_counts_are_refused(tmp_path, call):
    script = tmp_path / "w.py"
    script.write_text("print('ran')\n")
    with pytest.raises(ReaderError) as caught:
        call(script)
    one_sentence(caught.value)


def book_multihost():
    import book.multihost

    return book.multihost


def test_a_numpy_number_is_a_number_for_a_workers_environment(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("import os\nprint(os.environ['X'], os.environ['Y'])\n")
    env = {"X": np.int64(3), "Y": np.float32(0.5)}
    outputs = book_multihost().launch(script, num_processes=1, timeout=30, env=env)
    assert outputs[0].split() == ["3", "0.5"]


def test_a_task_label_of_thousands_of_digits_is_no_task():
    assert slurm.tasks("9" * 5000 + ": hi\n0: mine\n", 2) == ["mine\n", ""]


def test_display_sends_a_lone_surrogate_as_its_escape():
    from jupyter_client.session import json_packer

    shown = [
        display.table(["name"], [[SURROGATE]])._repr_html_(),
        display.error_html(SURROGATE),
        display.outputs_html([SURROGATE]),
    ]
    for markup in shown:
        json_packer({"data": {"text/html": markup}})  # what the kernel does with an output
        assert "\\ud800" in markup


@pytest.mark.parametrize("shape", [8, None, "24", (), (0, 2)])
def test_mesh_text_takes_a_shape_only(shape):
    with pytest.raises(ReaderError) as caught:
        display.mesh_text(shape)
    one_sentence(caught.value)


def test_a_reduction_of_blocks_of_two_shapes_is_refused():
    with pytest.raises(ReaderError, match="blocks of one shape"):
        display.collective_diagram([[1, 2], [3]], [[4, 2], [3]], reduce="sum")


@pytest.mark.parametrize(
    "index",
    [(slice(0, 8, 0),), (slice("a", None),), (slice(0.5, None),), "x", (slice(None), 3)],
)
def test_odd_slices_are_refused_in_one_sentence(index):
    from book import shards

    for call in (lambda: shards.index_key(index, (8, 4)),):
        with pytest.raises(ReaderError) as caught:
            call()
        one_sentence(caught.value)
    with pytest.raises(ReaderError):
        shards.index_key((slice(None),), "3")


def test_an_index_longer_than_the_shape_may_only_add_whole_slices():
    from book import shards

    with pytest.raises(ReaderError, match="give one slice per dimension") as caught:
        shards.index_key((slice(0, 2), slice(0, 2)), (16,))
    one_sentence(caught.value)
    # A key array's shard: its extra slice covers the key's own data.
    assert shards.index_key((slice(0, 2), slice(None)), (16,)) == ((0, 2),)


def test_absurd_attention_and_expert_sizes_name_what_the_reader_passed():
    with pytest.raises(ReaderError, match="expert_parallel is too large"):
        sizing.moe_all_to_all_bytes(
            2**31 - 1, top_k=8, d_model=2**31 - 1, experts=2**31 - 1, expert_parallel=2**31 - 1
        )
    with pytest.raises(ReaderError, match="K and V of these tokens, heads and head_dim"):
        cost.ring_attention_bytes(2**62, 2**31 - 1, 2**31 - 1, 2, 16)


def test_sgd_refuses_gradients_of_other_shapes_and_a_nan_rate():
    params = models.init(0, 4, 8, 3)
    with pytest.raises(ReaderError, match="has shape \\(\\), its parameter"):
        models.sgd(params, {k: jnp.ones(()) for k in params}, 0.1)
    with pytest.raises(ReaderError, match="finite"):
        models.sgd(params, params, jnp.array(jnp.nan))


def test_crossed_compiler_messages_give_fd_2_back(capfd):
    first, second = hlo.compiler_messages(), hlo.compiler_messages()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # out of order, as an ExitStack or two threads can
    second.__exit__(None, None, None)
    os.write(2, b"back\n")
    assert capfd.readouterr().err == "back\n"
    with pytest.raises(ReaderError, match="not catching"):
        hlo.compiler_messages().__exit__(None, None, None)


def test_write_over_a_folder_named_like_a_field_leaves_nothing(tmp_path):
    (tmp_path / "x.npy").mkdir()
    with pytest.raises(ReaderError, match="is not a file"):
        data.write(tmp_path, x=np.arange(8))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]


def test_small_results_that_were_wrong():
    from book import residuals

    assert timing.format_seconds(0.9995) == "1 s" and timing.format_seconds(0.0009995) == "0.999 ms"
    assert [r.nbytes for r in residuals.parse("f4_e2m1fn[1] from x\ni2[3] from y")] == [1, 1]

    def prints(x):
        print("tracing")
        return jnp.sin(x).sum()

    assert [r.dtype for r in residuals.saved(prints, jnp.ones(4))] == ["float32"]
    with pytest.raises(ReaderError, match="could not trace f"):
        residuals.saved(lambda x: x, "text")


def test_time_from_refuses_a_fifo_and_a_moment_yet_to_come(tmp_path):
    import time as clock

    run = subprocess.Popen(["true"])
    run.wait()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ReaderError, match="The log of 'a' is .*; give the path of a regular") as e:
        slurm.time_from({"a": run}, {"a": fifo}, r"at: (\S+)", 1, timeout=2)
    one_sentence(e.value)
    with pytest.raises(ReaderError, match="not an empty dict"):
        slurm.time_from({}, {}, r"at: (\S+)", 1, timeout=2)
    with pytest.raises(ReaderError, match=r"processes\['a'\] is None; give the subprocess"):
        slurm.time_from({"a": None}, {"a": fifo}, r"at: (\S+)", 1, timeout=2)
    later = tmp_path / "later"
    later.write_text(f"at: {clock.time() + 1000}\n")
    with pytest.raises(ReaderError, match="which is no time.time"):
        slurm.time_from({"a": run}, {"a": later}, r"at: (\S+)", 1, timeout=2)


def test_diagram_labels_that_look_like_markup_or_hold_surrogates_are_drawn():
    from jupyter_client.session import json_packer

    ring = display.ring_diagram(["<b>bold</b>", "a" + SURROGATE])
    json_packer({"data": ring._repr_mimebundle_()})
    assert "<b>bold</b>" in ring._repr_mimebundle_()["text/plain"]


# Sweep 11: odd but valid values read rightly, and odd arrays shown or refused in a sentence.
def test_exact_numbers_and_0d_flags_are_read():
    assert validate.seconds(Fraction(30), "timeout") == 30.0
    assert validate.seconds(__import__("decimal").Decimal("2.5"), "timeout") == 2.5
    assert validate.whole(Fraction(64, 8), "fsdp") == 8
    with pytest.raises(ReaderError, match="whole number"):
        validate.whole(Fraction(1, 2), "fsdp")
    assert validate.flag(np.array(True), "bidirectional") is True


def test_arrays_of_many_or_no_elements_are_shown():
    from book import display, shards

    assert shards.summarize(jnp.zeros((1,) * 9)).shape == (1,) * 9
    mesh = jax.make_mesh((8,), ("x",))
    empty = jax.device_put(jnp.zeros((8, 0)), NamedSharding(mesh, P("x")))
    assert "[] 1×0" in display.before_after_table(empty, empty).text
    assert "every block after is empty" in display.collective_diagram(empty, empty).text
    bf16 = [jnp.arange(2, dtype=jnp.bfloat16), jnp.arange(2, 4, dtype=jnp.bfloat16)]
    assert shards.trace_moves(bf16, bf16[::-1])[0] == {(0, 1): [0.0, 1.0], (1, 0): [2.0, 3.0]}
    with pytest.raises(ReaderError, match="nan equals nothing") as caught:
        shards.trace_moves([np.array([1.0, np.nan])], [np.array([1.0, np.nan])])
    one_sentence(caught.value)


def test_cancel_without_slurm_says_so(monkeypatch):
    from book import slurm

    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ReaderError, match="There is no scancel here") as caught:
        slurm.cancel(5)
    one_sentence(caught.value)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float8_e4m3fn, jnp.int4])
def test_ml_dtypes_arrays_are_read_as_numbers(dtype):
    from book.exercises import core

    a = jnp.ones((4, 4), dtype)
    assert checks.assert_product(jnp.full((4, 4), 4.0), a, a) == 0.0
    np.testing.assert_array_equal(core.numbers(a[0], "x"), np.ones(4))
    assert validate.widened(np.asarray(a)).dtype in (np.float32, np.int64)


def test_exact_numbers_in_an_environment_are_written_as_numbers():
    from decimal import Decimal

    from book import multihost

    env = {"A": Fraction(8), "B": Fraction(1, 4), "C": Decimal("2.50")}
    assert multihost._check_env(env, 1) == [{"A": "8", "B": "0.25", "C": "2.5"}]
    with pytest.raises(ReaderError, match="no finite number") as caught:
        multihost._check_env({"A": Decimal("nan")}, 1)
    one_sentence(caught.value)


# Sweep 12: a checker's groups and spec read strictly; strategies' helpers checked.
@pytest.mark.parametrize(
    "groups, out_spec, words",
    [
        ([[0.5, 4.7], [1.2, 5.9], [2, 6], [3, 7]], P("model"), "whole number"),
        (["04", "15", "26", "37"], P("model"), "Each group should be a list of device ids"),
        ([[True, 4], [1, 5], [2, 6], [3, 7]], P("model"), "whole number"),
        ([[0, 4], [0, 4], [1, 5], [2, 6], [3, 7]], P("model"), "list each id once"),
        ([[0, 4], [1, 5], [2, 6], [3, 7]], P(None, "model"), "1-D sums"),
        ([[0, 4], [1, 5], [2, 6], [3, 7]], P("nope"), "1-D sums"),
        ([[0, 4], [1, 5], [2, 6], [3, 7]], P("model", None, None), "1-D sums"),
    ],
)
def test_sum_groups_reads_ids_and_specs_strictly(groups, out_spec, words):
    from book import exercises

    verdict = exercises.ch03_sum_groups(groups, out_spec)
    assert verdict.judged and not verdict.ok and words in verdict.message, verdict
    assert exercises.ch03_sum_groups(np.array([[0, 4], [1, 5], [2, 6], [3, 7]]), P("model")).ok


def test_exact_numbers_are_read_by_the_checkers():
    from decimal import Decimal

    from book import exercises

    for rows in ([Fraction(2)], [Decimal(2)]):
        assert exercises.ch02_rows_on_device_1(rows).ok


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.mesh("dp", (8,)),
        lambda s: s.mesh("DP", (16,)),
        lambda s: s.mesh("DP x TP", (8,)),
        lambda s: s.mesh("DP", (0,)),
        lambda s: s.train_step("dp", s.mesh("DP", (8,))),
        lambda s: s.train_step("TP", s.mesh("DP", (8,))),
        lambda s: s.abstract_inputs("DP", "8", s.SIZES),
        lambda s: s.abstract_inputs("DP", s.mesh("DP", (8,)), (3, 4, 5, 6)),
    ],
)
def test_strategies_helpers_refuse_in_one_sentence(call):
    from book import strategies

    with pytest.raises(ReaderError) as caught:
        call(strategies)
    one_sentence(caught.value)


def test_lessons_refuse_what_they_would_compute_wrongly():
    from book.lessons import pipeline, transformer

    for heads, kv in ((12, 8), (4, 8)):
        with pytest.raises(ValueError, match="multiple of n_kv_heads"):
            transformer.Config(n_heads=heads, n_kv_heads=kv)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        transformer.Config(n_kv_heads=0)
    for orders, words in (
        ([[("X", 0)]], "pairs"),
        ([["FB"]], "pairs"),
        ([[("F", 0)] * 2], "twice"),
    ):
        with pytest.raises(ValueError, match=words):
            pipeline.simulate(orders)


@pytest.mark.parametrize(
    "op",
    [
        ("x", "a", "p", 0.0, 5.0),
        (0, "a", "p", "0", 5.0),
        (0, ["a"], "p", 0.0, 1.0),
        (0, "a", "p", float("nan"), 1.0),
        (None, "a", "p", 0.0, 1.0),
    ],
)
def test_a_timeline_of_hand_made_rows_names_the_odd_one(op):
    from book import trace

    with pytest.raises(ReaderError, match="Each Op needs a device number") as caught:
        display.timeline([trace.Op(0, "b", "p", 0.0, 1.0), trace.Op(*op)], {})
    one_sentence(caught.value)


def test_dtypes_are_read_by_name_or_type():
    from book import sizing

    m = sizing.PRESETS["Llama 3 8B"]
    by_name = [sizing.kv_cache_bytes(m, 4096, d) for d in ("float16", "bfloat16", "float8")]
    by_type = [sizing.kv_cache_bytes(m, 4096, d) for d in (np.float16, jnp.bfloat16)]
    assert by_type == by_name[:2]
    assert sizing.kv_cache_bytes(m, 4096, "float8_e4m3fn") == by_name[2]
    with pytest.raises(ReaderError, match="is not a cache dtype"):
        sizing.kv_cache_bytes(m, 4096, np.int32)


# Sweep 13: a search that follows a moving window, and patterns that cannot wait.
def test_a_line_past_the_kept_window_of_output_is_found(tmp_path):
    from book import multihost

    script = tmp_path / "steps.py"
    script.write_text(
        "import time\nfor i in range(3000):\n"
        "    print(f'step {i} loss 1.0 ' + '.' * 300, flush=True)\n"
        "    if i % 100 == 0: time.sleep(0.02)\ntime.sleep(30)\n"
    )
    with multihost.start(script, num_processes=1, timeout=60) as job:
        assert job.wait_for(r"^step 2999 ").group() == "step 2999 "
        assert len(job.output(0)) < 3000 * 300  # the output kept is the log's last part


@pytest.mark.parametrize(
    "pattern, words", [("^", "empty line"), ("x*", "empty line"), ("alpha\nbeta", "newline")]
)
def test_patterns_that_cannot_wait_for_a_line_are_refused(tmp_path, pattern, words):
    from book import multihost

    script = tmp_path / "waits.py"
    script.write_text("import time\nprint('alpha', flush=True)\ntime.sleep(30)\n")
    with multihost.start(script, num_processes=1, timeout=60) as job:
        with pytest.raises(ReaderError, match=words) as caught:
            job.wait_for(pattern)
        one_sentence(caught.value)


@pytest.mark.parametrize(
    "written",
    [
        r"loss\x0a",
        r"loss\012",
        r"\N{LINE FEED}x",
        "a[\n]b",
        r"step 10(?=\n)",
        r"(?<=\n)step 10",
        r"step 10(?>\n)",
        r"(x)?step 10(?(1)\n|\n)",
        r"step 10[\n-\n]",
    ],
)
def test_a_newline_written_any_way_is_refused_and_an_escaped_backslash_is_not(written):
    import re

    from book import linesearch, validate

    with pytest.raises(ReaderError, match="newline") as caught:
        linesearch.Search(validate.pattern(written), "the output")
    one_sentence(caught.value)
    windows = validate.pattern(re.escape(r"saved to C:\new"))  # a backslash, then n
    with linesearch.Search(windows, "the output") as search:
        found = search("step 1\nsaved to C:\\new\n", time.monotonic() + 30)
    assert found.group() == "saved to C:\\new"


def test_a_log_rewritten_from_its_start_is_searched_again():
    from book import linesearch, validate

    head = "=" * 250 + " starting\n"
    with linesearch.Search(validate.pattern(r"^step 1500 "), "the log") as search:
        assert search(head + "warmup line\n" * 100, time.monotonic() + 30) is None
        found = search(head + "step 1500 loss 0.1\n", time.monotonic() + 30)
    assert found.group() == "step 1500 "


def test_a_log_rewritten_with_its_old_end_still_in_it_is_searched_again():
    from book import linesearch, validate

    head = "=" * 250 + " starting\n"
    steps = [f"step {i} loss 0.{i:04d}\n" for i in range(1, 21)]
    old = head + "".join(steps)
    new = head + "resumed from step 10\n" + "".join(steps[10:])  # the same last 200 characters
    with linesearch.Search(validate.pattern(r"^resumed"), "the log") as search:
        assert search(old, time.monotonic() + 30) is None
        assert search(new, time.monotonic() + 30).group() == "resumed"


def test_a_line_ending_in_a_carriage_return_and_newline_ends_at_the_newline():
    from book import linesearch, validate

    with linesearch.Search(validate.pattern(r"step 7 ok$"), "the log") as search:
        assert search("step 7 ok\r\n", time.monotonic() + 30).group() == "step 7 ok"


def test_the_note_of_output_left_out_is_not_searched(tmp_path):
    from book import multihost

    script = tmp_path / "big.py"
    script.write_text(
        "import sys, time\n"
        "sys.stdout.write(''.join(f'step {i} loss 0.5\\n' for i in range(20000)))\n"
        "print('wrote 12,345 bytes', flush=True)\ntime.sleep(30)\n"
    )
    with multihost.start(script, num_processes=1, timeout=60) as job:
        assert job.wait_for(r"bytes").string == "wrote 12,345 bytes"
        assert "earlier bytes of output left out" in job.output(0)


def test_a_last_look_after_the_deadline_is_no_slow_pattern():
    from book import linesearch, validate

    with linesearch.Search(validate.pattern(r"^step 10 "), "the log") as search:
        assert search("step 10 done\n", time.monotonic() - 5).group() == "step 10 "


@pytest.mark.parametrize("edit", ["float16 product", "another chip's peaks"])
def test_a_run_edited_to_be_rated_against_the_wrong_peak_is_refused(tmp_path, edit):
    def change(data):
        if edit == "float16 product":
            data["kernels"]["rows"][0]["dtype"] = "float16"
        else:
            data["machine"]["peaks"]["chip"] = "H200"  # the run's device is an H100

    refused_run(edited_run(tmp_path, change), "is not a run as|peaks for a run on")


@pytest.mark.parametrize(
    "field, value",
    [
        ("device_kind", "NVIDIA H100 PCIe"),
        ("device_kind", "NVIDIA GH200 480GB"),
        ("device_kind", ["NVIDIA H100 80GB HBM3"]),
        ("median_s", "1"),
    ],
)
def test_a_run_edited_to_another_device_or_a_text_time_is_refused(tmp_path, field, value):
    def change(data):
        if field == "device_kind":
            data["kernels"]["device_kind"] = value
            if "GH200" in str(value):
                data["machine"]["peaks"]["chip"] = "H200"
        else:
            data["kernels"]["rows"][0][field] = value

    refused_run(edited_run(tmp_path, change), "peaks for a run on|which no time|names no device")


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda d: d["kernels"].update(device_kind=None), "names no device it ran on"),
        (lambda d: d["train"]["flags"].extend(["--batch", True]), "is not a run as"),
        (lambda d: d["train"]["flags"].extend(["--batch", 32.7]), "is not a run as"),
        (lambda d: d["kernels"].update(rows=[]), "holds no timed matrix products"),
    ],
)
def test_a_run_edited_by_hand_is_refused_now_not_in_a_chapter(tmp_path, edit, words):
    refused_run(edited_run(tmp_path, edit), words)  # True read as a batch of 1, 32.7 as 32


def test_a_flag_given_twice_counts_as_argparse_counts_it(tmp_path):
    from book import measured

    edited = edited_run(tmp_path, lambda data: data["train"]["flags"].extend(["--batch", "64"]))
    assert measured.load(edited).step()["batch"] == 64


def test_a_home_folder_no_user_can_have_is_named():
    from book import measured, trace

    for call in (lambda: measured.load("~\ud800/run.json"), lambda: trace.read("~\ud800")):
        with pytest.raises(ReaderError, match="names a home folder that does not exist") as caught:
            call()
        one_sentence(caught.value)


def test_a_home_folder_path_is_expanded_for_a_measurement(tmp_path, monkeypatch):
    from book import measured

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "run.json").write_text(measured.RESULTS.read_text())
    assert measured.load("~/run.json").device == measured.load().device


def test_residuals_of_explicitly_sharded_arrays_are_read():
    from book import residuals

    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("x")))
    (kept,) = residuals.saved(lambda a: jnp.sin(a).sum(), x)
    assert kept.type_text == "f32[16@x]" and residuals.total_bytes([kept]) == 64
    (two,) = residuals.parse("f32[8@(a,b),4@c] output of cos from f.py:1:1 (f)")
    assert two.shape == (8, 4) and two.nbytes == 128


@pytest.mark.parametrize(
    "op, guess",
    [("all_reduce", "all-reduce"), ("psum", "all-reduce"), ("AllReduce", "all-reduce"),
     ("ALL-REDUCE", "all-reduce"), ("all-reduce ", "all-reduce"), ("allreduce", "all-reduce"),
     ("all\u2010reduce", "all-reduce"), ("dot_general", "dot"), ("matmul", "dot"),
     ("cond", "conditional"), ("switch", "conditional"), ("scan", "while"),
     ("fori_loop", "while"), ("pjit", "call"), ("exp", "exponential"), ("mul", "multiply"),
     ("max", "maximum"), ("lt", "compare"), ("convert_element_type", "convert"),
     ("axis_index", "partition-id"), ("reduce_prod", "reduce"), ("reduce_and", "reduce"),
     ("log1p", "log-plus-one"), ("expm1", "exponential-minus-one"), ("cos", "cosine"),
     ("add_any", "add")],
)  # fmt: skip
def test_an_op_named_otherwise_than_hlo_names_it_is_refused(op, guess):
    step = jax.jit(lambda a: jnp.sum(a)).lower(jnp.ones(8)).compile()
    for call in (lambda: hlo.instructions(step, op), lambda: display.listing(step, ops=[op])):
        with pytest.raises(ReaderError, match=f"nearest name is .{guess}.") as caught:
            call()
        one_sentence(caught.value)


@pytest.mark.parametrize("op", ["remat", "xyzzy", "frobnicate"])
def test_a_name_near_no_hlo_operation_gets_no_guess(op):
    with pytest.raises(ReaderError, match="lower case with hyphens, such as 'all-gather'") as e:
        hlo.op_name(op)
    assert "nearest" not in str(e.value)


def test_op_names_a_program_adds_are_a_list_of_texts():
    assert hlo.op_name("my-op", ["my-op"]) == "my-op" and hlo.op_name("dot", None) == "dot"
    for also, words in (("abc", "a list of operation names"), ([1], "hold operation names")):
        with pytest.raises(ReaderError, match=words) as caught:
            hlo.op_name("dot", also)
        one_sentence(caught.value)


def test_a_deleted_array_is_named_deleted_by_the_product_check():
    a = jnp.ones((4, 4))
    a.delete()
    with pytest.raises(ReaderError, match="has been deleted"):
        checks.assert_product(jnp.ones((4, 4)), a, jnp.ones((4, 4)))


def test_sizing_refuses_top_k_without_experts_and_scale_only_floats():
    import ml_dtypes

    from book import sizing

    with pytest.raises(ReaderError, match="needs experts"):
        sizing.Transformer(2, 64, 128, 8, 8, 64, experts=0, top_k=5)
    m = sizing.PRESETS["Llama 3 8B"]
    with pytest.raises(ReaderError, match="is not a parameter dtype"):
        sizing.plan(m, global_batch=8, seq=4096, param_dtype=ml_dtypes.float8_e8m0fnu)


def edited_run(tmp_path, edit):
    """The stored GPU run, edited by ``edit(data)`` and written to a file of its own."""
    import json

    from book import measured

    data = json.loads(measured.RESULTS.read_text())
    edit(data)
    edited = tmp_path / "run.json"
    edited.write_text(json.dumps(data))
    return edited


def refused_run(path, words):
    """measured.load refuses the run at path in one sentence matching ``words``."""
    from book import measured

    with pytest.raises(ReaderError, match=words) as caught:
        measured.load(path)
    one_sentence(caught.value)


@pytest.mark.parametrize("bad", [float("nan"), -1.0, float("inf"), 0.0, True, False])
def test_a_run_edited_to_hold_no_time_is_refused(tmp_path, bad):
    edited = edited_run(tmp_path, lambda data: data["kernels"]["rows"][0].update(best_s=bad))
    refused_run(edited, "which no time, size|is not a run as")


def test_a_line_still_being_written_is_searched_only_once_it_stays():
    from book import linesearch, validate

    with linesearch.Search(validate.pattern(r"^step (\d+)"), "the log") as search:
        assert search("loss\nstep 1", time.monotonic() + 30) is None  # being written
        found = search("loss\nstep 10 loss 0.25\n", time.monotonic() + 30)
        assert found.group() == "step 10"
    with linesearch.Search(validate.pattern(r"ready> $"), "the log") as search:
        assert search("ready> ", time.monotonic() + 30) is None
        assert search("ready> ", time.monotonic() + 30).group() == "ready> "  # a prompt


@pytest.mark.parametrize("edit", ["batch 0", "best above median"])
def test_a_run_no_benchmark_gives_is_refused(tmp_path, edit):
    def change(data):
        if edit == "batch 0":
            flags = data["train"]["flags"]
            flags[flags.index("--batch") + 1] = "0"
        else:
            row = data["kernels"]["rows"][0]
            row["best_s"] = row["median_s"] * 2

    refused_run(edited_run(tmp_path, change), "holds a run no benchmark gives")


def test_a_pattern_of_whitespace_is_called_so():
    from book import validate

    with pytest.raises(ReaderError, match="only whitespace"):
        validate.pattern(" \t")


# Sweep 25: exact numbers in a product check; the offending entry of an index named.
def test_assert_product_reads_fractions_and_an_index_names_its_ellipsis():
    from fractions import Fraction

    from book import checks, validate

    assert checks.assert_product([[Fraction(1, 9)]], [[Fraction(1, 3)]], [[Fraction(1, 3)]]) == 0
    with pytest.raises(ReaderError, match="not one holding an ellipsis"):
        validate.slices((slice(0, 4), Ellipsis), "index")


# Sweep 26: long doubles, long times, masked values, deleted arguments, a trace bomb, labels.
def test_sweep_26_times_masks_and_labels(tmp_path, monkeypatch):
    import gzip

    import jax
    import jax.numpy as jnp

    from book import cost, models, timing, trace

    assert timing.format_seconds(np.longdouble(0.25)) == "250 ms"
    assert timing.format_seconds(999.5) == "1,000 s" and timing.format_seconds(12.3) == "12.3 s"
    for bad in (
        lambda: timing.format_seconds(np.ma.masked),
        lambda: cost.all_reduce_bytes(np.ma.array(1024.0, mask=True), 8),
    ):
        with pytest.raises(ReaderError, match="a masked value"):
            bad()
    x = jnp.ones(4)
    x.delete()
    with pytest.raises(ReaderError, match="deleted before measure was called"):
        timing.measure(jax.jit(lambda v: v * 2), x, runs=2)
    run = tmp_path / "plugins" / "profile" / "r"
    run.mkdir(parents=True)
    with gzip.open(run / "perfetto_trace.json.gz", "wb") as f:
        f.write(b'{"traceEvents": [' + b" " * 4096 + b"]}")
    monkeypatch.setattr(trace, "MAX_TRACE_BYTES", 1024)
    with pytest.raises(ReaderError, match="unpacks to more than"):
        trace.read(tmp_path)
    logits = jnp.zeros((2, 16))
    for label in (-1, 99):  # under jit the labels are not known: the loss is nan, not wrong
        loss = jax.jit(models.cross_entropy)(logits, jnp.array([label, 0], jnp.int32))
        assert np.isnan(float(loss))


# Sweep 27: a product that is exactly 0 where the result is not.
def test_assert_product_names_an_entry_where_the_product_is_zero():
    from book import checks

    with pytest.raises(AssertionError, match="is 6 where A @ B is 0"):
        checks.assert_product(np.full((2, 2), 6.0), np.zeros((2, 3)), np.ones((3, 2)))


# Sweep 27: huge residuals, a bad layout, a quoted answer.
def test_sweep_27_residuals_indexes_layouts_and_quotes():
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from book import exercises, residuals
    from book.exercises import manual
    from book.exercises.core import line_mesh

    huge = jax.ShapeDtypeStruct((10**12,), jnp.float32)
    found = residuals.saved(lambda x: jnp.sin(jnp.sin(x)).sum(), huge)
    assert [r.shape for r in found] == [(10**12,)] * 2
    layout = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}
    verdict = exercises.ch16_restore_on(lambda path, mesh: None, {**layout, "w1": P("m", "m")})
    assert not verdict.ok and "names a mesh axis twice" in verdict.message
    rows = manual._chapter_05_rows(line_mesh("i"))
    verdict = exercises.ch05_predict_all_to_all((8, 1), rows[:, 2])
    assert not verdict.ok and "does not hold [102.0, 112.0" in verdict.message


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda a: shards.trace_moves(a, a), "trace_moves's before"),
        (lambda a: display.before_after_table(a, a), "before_after_table's before"),
        (lambda a: display.collective_diagram(a, a), "collective_diagram's before"),
    ],
)
def test_a_refused_array_is_named_as_the_function_called_names_it(call, name):
    keys = jax.random.split(jax.random.key(0), 8)
    gone = jnp.arange(8.0)
    gone.delete()
    for refused in (keys, gone):
        with pytest.raises(ReaderError) as caught:
            call(refused)
        assert str(caught.value).startswith(name) and "device_blocks" not in str(caught.value)


def test_too_many_examples_are_named_as_a_batch_not_n():
    with pytest.raises(ReaderError, match=r"The number of examples \(n, a batch\) is too large"):
        models.synthetic_data(1, 2**25, 8, 8)


def test_trace_moves_refuses_arrays_whose_positions_name_other_devices():
    from jax.sharding import Mesh

    devices = jax.devices()
    x = jax.device_put(jnp.arange(8.0), NamedSharding(Mesh(np.array(devices), ("x",)), P("x")))
    y = jax.device_put(x, NamedSharding(Mesh(np.array(devices[::-1]), ("x",)), P("x")))
    with pytest.raises(ReaderError, match="in another order or on other devices") as caught:
        shards.trace_moves(x, y)  # read by position, every value would seem to stay home
    one_sentence(caught.value)
