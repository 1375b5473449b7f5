"""Parsing and checking what a reader types: every mistake is one plain sentence."""

import re

import pytest
from jax.sharding import PartitionSpec as P

from book.specs import (
    SpecError,
    check_mesh,
    check_sharding,
    parse_axis_names,
    parse_mesh_shape,
    parse_partition_spec,
    parse_shape,
)

MESH = {"data": 2, "model": 4}


@pytest.mark.parametrize(
    "text, shape",
    [("(4, 2)", (4, 2)), ("4x2", (4, 2)), ("[2, 2, 2]", (2, 2, 2)), ("8", (8,)), ("(8,)", (8,))],
)
def test_mesh_shapes(text, shape):
    assert parse_mesh_shape(text) == shape


@pytest.mark.parametrize("text", ["", "(4, two)", "(4, -2)", "(0, 8)", "4.5", "(2,,4)", "1" * 300])
def test_bad_mesh_shapes(text):
    with pytest.raises(SpecError):
        parse_mesh_shape(text)


def test_shape_message_names_the_bad_part():
    with pytest.raises(SpecError, match="Could not read 'two'"):
        parse_shape("(4, two)")


@pytest.mark.parametrize(
    "text, names",
    [("('data', 'model')", ("data", "model")), ("data, model", ("data", "model")), ("x", ("x",))],
)
def test_axis_names(text, names):
    assert parse_axis_names(text) == names


@pytest.mark.parametrize(
    "text, why", [("data, data", "appears twice"), ("data, 2x", "not a usable axis name")]
)
def test_bad_axis_names(text, why):
    with pytest.raises(SpecError, match=why):
        parse_axis_names(text)


@pytest.mark.parametrize(
    "text, spec",
    [
        ("P('data', None)", P("data", None)),
        ("PartitionSpec(None, 'model')", P(None, "model")),
        ("P('data', 'model')", P("data", "model")),
        ("P(('data', 'model'), None)", P(("data", "model"), None)),
        ("P()", P()),
        ("('data', None)", P("data", None)),
        ("(('data', 'model'), None)", P(("data", "model"), None)),
        ("'data', None", P("data", None)),
        ('P("data")', P("data")),
        ("P(data, None)", P("data", None)),
        ("P(('data',), None)", P("data", None)),
    ],
)
def test_partition_specs(text, spec):
    assert parse_partition_spec(text) == spec


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('echo hacked')",
        "P(open('/etc/passwd').read())",
        "P('data'); import os",
        "P(lambda: 0)",
        "P(*['data'])",
        "P('data' + 'x')",
        "P(f('data'))",
        "P((('data',),))",
        "P(('data', None))",
        "P(('data'",
        "exec('1')",
        "P('data' 'model')",
        "x" * 500,
    ],
)
def test_malicious_or_broken_specs_are_refused_without_evaluation(text, capfd):
    with pytest.raises(SpecError) as info:
        parse_partition_spec(text)
    message = str(info.value)
    assert message.endswith(".") and "\n" not in message
    assert "hacked" not in capfd.readouterr().out


def test_check_sharding_accepts_good_layouts():
    check_sharding((8, 4), MESH, P("data", "model"))
    check_sharding((8, 4), MESH, P(("data", "model"), None))
    check_sharding((8, 4), MESH, P())


@pytest.mark.parametrize(
    "shape, spec, why",
    [
        ((8, 4), P("data", "data"), "Axis 'data' is used twice"),
        ((8, 4), P(("data", "model"), "model"), "Axis 'model' is used twice"),
        ((8, 4), P("rows"), "Axis 'rows' is not in the mesh, whose axes are 'data' and 'model'"),
        ((6, 4), P("model"), "Dimension 0 has size 6, which the 4 devices of model=4"),
        ((12, 4), P(("data", "model")), "size divisible by 8"),
        ((8,), P("data", None), "has 2 entries but the array has rank 1"),
    ],
)
def test_check_sharding_explains(shape, spec, why):
    with pytest.raises(SpecError, match=why.replace("(", r"\(").replace(")", r"\)")) as info:
        check_sharding(shape, MESH, spec)
    assert str(info.value).count(". ") == 0 and str(info.value).endswith(".")


def test_check_mesh():
    check_mesh((2, 4), ("data", "model"), 8)
    with pytest.raises(SpecError, match="A 4x4 mesh needs 16 devices but there are 8"):
        check_mesh((4, 4), ("data", "model"), 8)


def test_check_mesh_accepts_what_make_mesh_accepts():
    """A mesh smaller than the device count is no mistake: make_mesh takes the first devices."""
    import jax
    from jax.sharding import AxisType

    check_mesh((2, 2), ("a", "b"), 8)
    made = jax.make_mesh((2, 2), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
    assert made.devices.size == 4
    with pytest.raises(SpecError, match="whose product is at most 8"):
        check_mesh((3, 3), ("a", "b"), 8)
    with pytest.raises(ValueError):
        jax.make_mesh((3, 3), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
    with pytest.raises(SpecError, match="give one name per axis"):
        check_mesh((2, 2, 2), ("data", "model"), 8)


def test_check_sharding_takes_a_real_mesh():
    import jax
    from jax.sharding import AxisType

    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    with pytest.raises(SpecError, match="cannot split evenly"):
        check_sharding((6, 4), mesh, P("model", None))


@pytest.mark.parametrize(
    "text, words",
    [
        ("(8, ²)", "write sizes with the digits 0 to 9"),
        ("(8, ①)", "write sizes with the digits 0 to 9"),
        ("(٣, 8)", "write sizes with the digits 0 to 9"),
        ("(8, " + "9" * 40 + ")", "40 digits, more than the book can use"),
        ("(" + ", ".join(["1"] * 40) + ")", "has 40 sizes; use at most 8"),
    ],
)
def test_sizes_that_are_not_what_they_look_like(text, words):
    with pytest.raises(SpecError, match=words):
        parse_mesh_shape(text)


@pytest.mark.parametrize("value", [None, 8, ("data",), b"(8,)"])
def test_texts_that_are_not_text(value):
    for parse in (parse_shape, parse_axis_names, parse_partition_spec):
        with pytest.raises(SpecError, match="as text"):
            parse(value)


def test_check_functions_refuse_wrong_kinds():
    with pytest.raises(SpecError, match="mapping from axis name to size"):
        check_sharding((8, 4), [("data", 2)], P())
    with pytest.raises(SpecError, match="PartitionSpec"):
        check_sharding((8, 4), MESH, ["data"])
    with pytest.raises(SpecError, match="positive whole number"):
        check_mesh((2, True), ("data", "model"), 8)
    with pytest.raises(SpecError, match="tuple of names"):
        check_mesh((2, 4), "data, model", 8)
    check_sharding((8, 4), MESH, "P('data', None)")  # the text of a spec is read


def test_a_shape_without_sizes_is_named_so():
    for text in ("()", "[]", "( )"):
        with pytest.raises(SpecError, match="has no sizes; give at least one"):
            parse_shape(text)


@pytest.mark.parametrize(
    "text, words",
    [
        ("(8, 4)#", "Unexpected '#' after the closing bracket"),
        ("'(8, 4)'", 'Unexpected "\'"'),
        ("(2**3, 4)", "writes a power; write each size as a number"),
        ("(8,,4)", "an empty size between two separators"),
    ],
)
def test_a_stray_character_in_a_shape_is_named(text, words):
    with pytest.raises(SpecError, match=re.escape(words)):
        parse_shape(text)


@pytest.mark.parametrize(
    "text, said",
    [("(2**40, 2**40)", "writes a power"), ("(8, 4", "no closing bracket"), ("[8", "no closing")],
)
def test_a_shape_with_a_power_or_no_closing_bracket_is_named_so(text, said):
    with pytest.raises(SpecError, match=said):
        parse_shape(text)


@pytest.mark.parametrize(
    "text, spec",
    [
        ("P('data',\u00a0None)", P("data", None)),  # a no-break space, pasted from a page
        ("P('data',\u2009'model')", P("data", "model")),  # a thin space
        ("\u3000P('data')", P("data")),  # an ideographic space before it
    ],
)
def test_specs_read_any_space_between_tokens(text, spec):
    assert parse_partition_spec(text) == spec


@pytest.mark.parametrize(
    "text, odd",
    [
        ("P('d\u0430ta', None)", "'а' (U+0430)"),  # a Cyrillic a that looks Latin
        ("P(('data\u200b', 'model'))", "(U+200B)"),  # a zero-width space, in a group
    ],
)
def test_a_quoted_name_with_an_odd_character_names_it(text, odd):
    with pytest.raises(SpecError, match="is not a usable axis name: it holds") as caught:
        parse_partition_spec(text)
    assert odd in str(caught.value)
