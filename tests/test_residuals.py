"""book.residuals: what autodiff saves, read from print_saved_residuals, on mock CPU devices."""

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import book.residuals
from book.errors import ReaderError


def test_a_product_saves_its_operands_with_their_shapes_and_bytes():
    def f(w, x):
        return jnp.sum(jnp.sin(x @ w))

    w, x = jnp.ones((4, 3)), jnp.ones((2, 4), jnp.bfloat16)
    found = book.residuals.saved(f, w, x)
    shapes = {r.shape for r in found}
    assert (4, 3) in shapes and (2, 3) in shapes
    for r in found:
        assert r.nbytes == r.shape[0] * r.shape[1] * {"float32": 4, "bfloat16": 2}[r.dtype]
        assert ":" not in r.source.split(" in ")[-1]  # no file and line left
    assert book.residuals.total_bytes(found) == sum(r.nbytes for r in found)


def test_name_p_is_what_checkpoint_name_binds():
    (eqn,) = jax.make_jaxpr(lambda v: checkpoint_name(v, "kept"))(1.0).eqns
    assert eqn.primitive is book.residuals.name_p


def test_the_source_tells_a_named_value_from_an_operation():
    def f(x):
        y = checkpoint_name(jnp.sin(x), "kept")
        return jnp.sum(jnp.cos(y))

    plain = book.residuals.saved(f, jnp.ones(5))
    assert {r.source.split(" in ")[0] for r in plain} == {"output of sin", "output of cos"}
    policy = jax.checkpoint_policies.save_only_these_names("kept")
    found = book.residuals.saved(jax.checkpoint(f, policy=policy), jnp.ones(5))
    (named,) = [r for r in found if "named 'kept'" in r.source]
    assert str(named).startswith("f32[5]") and named.nbytes == 20


def test_inside_shard_map_it_lists_one_devices_blocks():
    mesh = jax.make_mesh((8,), ("i",), axis_types=(AxisType.Explicit,))
    found = []

    def body(x):
        found.extend(book.residuals.saved(lambda x: jnp.sum(jnp.sin(x)), x))
        return x

    x = jax.device_put(jnp.ones(16), NamedSharding(mesh, P("i")))
    jax.eval_shape(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")), x)
    assert [r.shape for r in found] == [(2,)]


def test_parse_reads_every_dtype_and_refuses_what_is_not_a_printout():
    text = "bool[3]{V:data} output of gt from a.py:1:2 (f)\ni32[2,1] from a constant\nc64[] x\n"
    found = book.residuals.parse(text)
    assert [(r.dtype, r.nbytes) for r in found] == [("bool", 3), ("int32", 8), ("complex64", 8)]
    assert found[0].source == "output of gt in f"
    with pytest.raises(ReaderError, match="does not start with an array type"):
        book.residuals.parse("nothing here")
    low = book.residuals.parse("f8_e4m3fn[4] output of convert\nf8_e5m2[2,2] x\nf4_e2m1fn[8] y\n")
    assert [(r.dtype, r.nbytes) for r in low] == [
        ("float8_e4m3fn", 4),
        ("float8_e5m2", 4),
        ("float4_e2m1fn", 4),
    ]


@pytest.mark.parametrize("axis", ["a" * 61, "a b"])
def test_residuals_of_arrays_split_over_any_axis_name_are_read(axis):
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((8,), (axis,), axis_types=(AxisType.Explicit,))
    y = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P(axis)))
    (kept,) = book.residuals.saved(jnp.sin, y)
    assert kept.shape == (8, 4) and kept.type_text == f"f32[8@{axis},4]"


def test_a_line_the_function_prints_is_no_residual(capsys):
    import jax.numpy as jnp

    def f(x):
        print("f32[3] is the shape I expect")
        return jnp.sin(x)

    (kept,) = book.residuals.saved(f, jnp.ones(4))
    assert kept.shape == (4,)
    assert "f32[3] is the shape I expect" in capsys.readouterr().out


def test_a_name_that_reads_like_a_place_keeps_its_own_place():
    def f(v):
        h = checkpoint_name(jnp.sin(v), "hidden from x.py:1:2 (g)")
        return jnp.sum(h * h)

    sources = [r.source for r in book.residuals.saved(f, jnp.ones((4, 3)))]
    where = " in test_a_name_that_reads_like_a_place_keeps_its_own_place.<locals>.f"
    assert sources == ["output of cos" + where, "named 'hidden from x.py:1:2 (g)'" + where]


def test_a_name_holding_a_line_break_is_refused_not_read_as_two_residuals():
    def f(v):
        h = checkpoint_name(jnp.sin(v), "a\nf32[99] from the argument z")
        return jnp.sum(h * h)

    with pytest.raises(ReaderError, match="holds a line break"):
        book.residuals.saved(f, jnp.ones((4, 3)))


def test_a_residual_jax_found_no_frame_for_ends_without_from():
    import jax.numpy as jnp

    assert [r.source for r in book.residuals.saved(jnp.sin, jnp.ones(4))] == ["output of cos"]
