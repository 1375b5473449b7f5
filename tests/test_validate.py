"""book.validate: what a reader passes becomes a value the book can use, or one sentence."""

import math
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from book import validate
from book.errors import ReaderError

QUICK = settings(
    max_examples=150,
    deadline=timedelta(milliseconds=500),
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Digits other than 0-9: superscripts, circled numbers, other scripts' digits, fractions.
UNICODE_DIGITS = st.characters(categories=["Nd", "No", "Nl"]).filter(
    lambda c: c not in "0123456789"
)
HUGE = st.integers(min_value=19, max_value=20_000).map(lambda k: 10**k)
ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    HUGE,
    HUGE.map(lambda v: -v),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=300),
    st.text(UNICODE_DIGITS, min_size=1, max_size=5),
    st.binary(max_size=20),
    st.lists(st.integers(), max_size=12),
    st.tuples(st.integers(), st.text(max_size=5)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.builds(object),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(np.float32, st.floats(width=32)),
    st.builds(np.zeros, st.integers(0, 4)),
)


def one_sentence(err: ReaderError) -> str:
    message = str(err)
    assert message and "\n" not in message and message.endswith("."), message
    assert len(message) < 400, message
    return message


@QUICK
@given(ANYTHING, st.booleans())
def test_whole_gives_a_number_in_range_or_one_sentence(value, text):
    try:
        number = validate.whole(value, "n", low=1, high=1000, text=text)
    except ReaderError as err:
        one_sentence(err)
        return
    assert type(number) is int and 1 <= number <= 1000
    assert not isinstance(value, (bool, np.bool_, float))
    if isinstance(value, str):
        assert text and value.strip().lstrip("+").lstrip("0").isascii()


@QUICK
@given(st.text(UNICODE_DIGITS, min_size=1, max_size=4), st.sampled_from(["", "8", "1"]))
def test_digits_other_than_0_to_9_are_refused(odd, around):
    with pytest.raises(ReaderError) as caught:
        validate.whole(around + odd, "n", text=True)
    one_sentence(caught.value)


@QUICK
@given(st.integers(min_value=19, max_value=20_000))
def test_huge_numbers_are_named_not_printed(digits):
    value = 10**digits  # str() refuses integers of more than 4300 digits
    for number in (value, -value, "1" + "0" * digits):
        with pytest.raises(ReaderError) as caught:
            validate.whole(number, "n", low=-(2**31), text=True)
        assert "too large" in one_sentence(caught.value) or "at least" in str(caught.value)


@QUICK
@given(ANYTHING)
def test_seconds_are_finite_positive_and_bounded(value):
    try:
        seconds = validate.seconds(value, "timeout", high=3600)
    except ReaderError as err:
        one_sentence(err)
        return
    assert math.isfinite(seconds) and 0 < seconds <= 3600


@QUICK
@given(ANYTHING)
def test_flags_are_true_or_false_only(value):
    try:
        flag = validate.flag(value, "tiled")
    except ReaderError as err:
        one_sentence(err)
        return
    assert isinstance(value, (bool, np.bool_)) and flag is bool(value)


@QUICK
@given(ANYTHING)
def test_choices_and_names(value):
    for check in (
        lambda: validate.choice(value, ["psum", "pmean"], "a collective"),
        lambda: validate.name(value, "The axis name"),
        lambda: validate.text(value, "the spec", example="P()"),
        lambda: validate.sizes(value, "The shape"),
    ):
        try:
            check()
        except ReaderError as err:
            one_sentence(err)


@QUICK
@given(ANYTHING)
def test_describe_is_short_and_never_fails(value):
    shown = validate.describe(value)
    assert isinstance(shown, str) and "\n" not in shown and len(shown) <= 200


@pytest.mark.parametrize(
    "value, number",
    [(8, 8), (np.int64(8), 8), (np.uint8(8), 8), ("8", 8), (" 8 ", 8), ("+8", 8)],
)
def test_whole_numbers_taken(value, number):
    assert validate.whole(value, "n", text=True) == number


@pytest.mark.parametrize(
    "value, words",
    [
        (True, "not True"),
        (np.True_, "not True"),
        (8.0, "not 8.0"),
        ("²", "typed with the digits 0 to 9"),
        ("①", "typed with the digits 0 to 9"),
        ("--1", "not '--1'"),
        ("8", "(a string)"),  # without text=True, as Python functions take it
        (0, "positive whole number"),
        (2**40, "use at most"),
    ],
)
def test_whole_numbers_refused(value, words):
    with pytest.raises(ReaderError, match=words.replace("(", r"\(").replace(")", r"\)")):
        validate.whole(value, "n", text=not (value == "8"), high=2**31)


def test_a_huge_number_is_named_by_its_length():
    with pytest.raises(ReaderError, match="a number with about 10,001 digits"):
        validate.whole(10**10000, "n")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0, -1, True, "60", None])
def test_timeouts_refused(value):
    with pytest.raises(ReaderError):
        validate.seconds(value, "timeout")


def test_text_false_is_not_true():
    with pytest.raises(ReaderError, match="True or False, not 'False'"):
        validate.flag("False", "tiled")


@pytest.mark.parametrize("text", ["\udcff", "a\ud800b"])
def test_a_lone_surrogate_is_no_text(text):
    """What Python makes of bytes that are not UTF-8: no page or plot can show it."""
    with pytest.raises(ReaderError, match="holds a character that is not text"):
        validate.text(text, "the title", example="'x'")


def test_process_counts_are_bounded_by_the_machine():
    most = validate.max_processes()
    assert 2 <= most <= 64
    assert validate.processes(2, "num_processes") == 2
    with pytest.raises(ReaderError, match="more processes than this machine can run"):
        validate.processes(most + 1, "num_processes")


def test_wrong_kinds_of_things():
    import jax

    with pytest.raises(TypeError, match="placed with jax.device_put"):
        validate.array(np.zeros(8), "x")
    f = jax.jit(lambda x: x)
    with pytest.raises(TypeError, match="not its compiled program"):
        validate.compiled(f)
    with pytest.raises(TypeError, match="pass the result of .compile"):
        validate.compiled(f.lower(np.zeros(2)))
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        validate.mesh("mesh")


class ClaimsToBeText:
    """isinstance(value, str) is True, yet it holds no text: its __class__ says str."""

    @property
    def __class__(self):
        return str


class ClaimsToBeWhole:
    @property
    def __class__(self):
        return int


def test_an_object_claiming_to_be_text_is_refused_as_what_it_is():
    value = ClaimsToBeText()
    for check in (
        lambda: validate.choice(value, ["psum", "pmean"], "a collective"),
        lambda: validate.name(value, "The axis name"),
        lambda: validate.text(value, "the spec", example="P()"),
        lambda: validate.whole(value, "The size", text=True),
        lambda: validate.signal_of(value),
    ):
        with pytest.raises(ReaderError) as err:
            check()
        assert "ClaimsToBeText" in one_sentence(err.value)
    for check in (
        lambda: validate.signal_of(ClaimsToBeWhole()),
        lambda: validate.whole(ClaimsToBeWhole(), "The size"),
    ):
        with pytest.raises(ReaderError) as err:
            check()
        assert "ClaimsToBeWhole" in one_sentence(err.value)


@pytest.mark.parametrize("typed, value", [("00000000000000000008", 8), ("+008", 8), ("000", 0)])
def test_leading_zeros_a_reader_types_add_no_size(typed, value):
    assert validate.whole(typed, "n", text=True, low=0) == value


@pytest.mark.parametrize(
    "dated",
    [np.timedelta64(1000, "ns"), np.timedelta64(5), np.timedelta64(2, "s"), np.datetime64("2020")],
)
def test_a_numpy_duration_or_date_is_no_number_whatever_its_unit(dated):
    with pytest.raises(ReaderError, match="not a (timedelta|datetime)64"):
        validate.number(dated, "bytes")


def test_local_refuses_what_is_no_text_in_one_sentence():
    for odd in (b"gs://b", None):
        with pytest.raises(ReaderError, match="must be a path as text"):
            validate.local(odd, "The folder")
    assert validate.local("runs/a", "The folder") == "runs/a"
