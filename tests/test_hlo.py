"""book.hlo on programs whose communication is known, compiled for the 8 mock CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import book.hlo
from book.viz import Diagram, Rendered

ALL = (tuple(range(8)),)
# Ask XLA for its older replica-group notations (lists and iota tiles) instead of mesh axes,
# so the three parsers can be checked against each other on the same program.
LEGACY_GROUPS = {"xla_enable_rgv3_materialization": False}


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))


@pytest.fixture(scope="module")
def mesh2d():
    return jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)


def put(shape, mesh, spec, dtype=jnp.float32):
    x = jnp.arange(np.prod(shape), dtype=dtype).reshape(shape)
    return jax.device_put(x, NamedSharding(mesh, spec))


def test_reduction_over_sharded_axis_is_one_all_reduce(mesh):
    x = put((16, 8), mesh, P("x", None))
    compiled = jax.jit(lambda x: x.sum(axis=0)).lower(x).compile()
    (row,) = book.hlo.collectives(compiled)
    assert row.op == "all-reduce"
    assert row.shape == (8,)
    assert row.dtype == "float32"
    assert row.bytes == 8 * 4
    assert row.groups == ALL
    assert row.group_size == 8


def test_matmul_with_contraction_dim_sharded_all_reduces_the_product(mesh):
    a = put((16, 32), mesh, P(None, "x"))
    b = put((32, 8), mesh, P("x", None))
    compiled = jax.jit(jnp.matmul).lower(a, b).compile()
    (row,) = book.hlo.collectives(compiled)
    assert (row.op, row.shape, row.bytes, row.groups) == ("all-reduce", (16, 8), 16 * 8 * 4, ALL)


def test_ring_ppermute_is_a_collective_permute_with_its_pairs(mesh):
    ring = [(i, (i + 1) % 8) for i in range(8)]
    f = jax.shard_map(
        lambda x: jax.lax.ppermute(x, "x", ring), mesh=mesh, in_specs=P("x"), out_specs=P("x")
    )
    # int8, one byte an element; (the CPU compiler widens bf16 collectives to f32.)
    x = put((16, 8), mesh, P("x", None), jnp.int8)
    (row,) = book.hlo.collectives(jax.jit(f).lower(x).compile())
    assert row.op == "collective-permute"
    assert row.shape == (2, 8)
    assert row.dtype == "int8"
    assert row.bytes == 2 * 8 * 1
    assert row.groups == tuple(ring)


def test_all_gather_result_is_the_full_array(mesh):
    x = put((16, 8), mesh, P("x", None))
    compiled = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P())).lower(x).compile()
    assert [(r.op, r.shape, r.bytes) for r in book.hlo.collectives(compiled)] == [
        ("all-gather", (16, 8), 16 * 8 * 4)
    ]


def test_all_to_all_tuple_result_sums_its_parts(mesh):
    x = put((16, 8), mesh, P("x", None))
    out = NamedSharding(mesh, P(None, "x"))
    (row,) = book.hlo.collectives(jax.jit(lambda x: x, out_shardings=out).lower(x).compile())
    assert row.op == "all-to-all"
    assert all(len(s) == 3 for s in row.shape)
    assert row.bytes == sum(int(np.prod(s)) for s in row.shape) * 4 == 2 * 8 * 4


def test_groups_on_a_2d_mesh_follow_the_reduced_axis(mesh2d):
    x = put((8, 8), mesh2d, P("a", "b"))
    over_a = book.hlo.collectives(jax.jit(lambda x: x.sum(0)).lower(x).compile())
    over_b = book.hlo.collectives(jax.jit(lambda x: x.sum(1)).lower(x).compile())
    assert over_a[0].groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert over_b[0].groups == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_reduce_scatter_from_psum_scatter(mesh):
    f = jax.shard_map(
        lambda x: jax.lax.psum_scatter(x, "x", tiled=True),
        mesh=mesh,
        in_specs=P(),
        out_specs=P("x"),
    )
    (row,) = book.hlo.collectives(jax.jit(f).lower(jnp.ones((16, 8))).compile())
    assert (row.op, row.shape, row.bytes, row.groups) == ("reduce-scatter", (2, 8), 64, ALL)


RESHARDS = [
    ("a,b -> b,a", P("a", "b"), P("b", "a")),
    ("a,b -> None,a", P("a", "b"), P(None, "a")),
    ("(b,a) -> b", P(("b", "a")), P("b")),
    ("a,b -> replicated", P("a", "b"), P()),
]


@pytest.mark.parametrize("name,src,dst", RESHARDS, ids=[r[0] for r in RESHARDS])
def test_mesh_axes_groups_match_the_older_notations(mesh2d, name, src, dst):
    x = put((8, 8), mesh2d, src)
    lowered = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh2d, dst)).lower(x)
    new = book.hlo.collectives(lowered.compile())
    old = book.hlo.collectives(lowered.compile(compiler_options=LEGACY_GROUPS))
    assert new, name
    assert [(r.op, r.groups, r.bytes) for r in new] == [(r.op, r.groups, r.bytes) for r in old]


def test_reduction_over_flattened_axes_matches_the_older_notation(mesh2d):
    x = put((8, 8), mesh2d, P(("b", "a")))
    lowered = jax.jit(lambda x: x.sum(0)).lower(x)
    (new,) = book.hlo.collectives(lowered.compile())
    (old,) = book.hlo.collectives(lowered.compile(compiler_options=LEGACY_GROUPS))
    assert new.groups == old.groups == ((0, 4, 1, 5, 2, 6, 3, 7),)


def test_no_collectives_when_every_device_has_its_data(mesh):
    x = put((16, 8), mesh, P("x", None))
    compiled = jax.jit(lambda x: 2 * x + 1).lower(x).compile()
    assert book.hlo.collectives(compiled) == []
    assert "No collectives" in repr(book.hlo.collective_table(compiled))


def test_a_lowered_program_is_refused_with_a_hint(mesh):
    x = put((16, 8), mesh, P("x", None))
    with pytest.raises(TypeError, match="compile"):
        book.hlo.collectives(jax.jit(lambda x: x.sum()).lower(x))


# Text in the shape GPU compilers print: asynchronous halves, iota and explicit groups.
ASYNC_HLO = """HloModule m, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%wrapped_all_to_all (p: bf16[8,4]) -> bf16[8,4] {
  %p = bf16[8,4]{1,0} parameter(0)
  ROOT %all-to-all.3 = bf16[8,4]{1,0} all-to-all(%p), channel_id=4, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}
}

ENTRY %main (x: f32[2,8]) -> f32[16,8] {
  %x = f32[2,8]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %all-gather-start = (f32[2,8]{1,0}, f32[16,8]{1,0}) all-gather-start(f32[2,8]{1,0} %x), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  %all-gather-done = f32[16,8]{1,0} all-gather-done((f32[2,8]{1,0}, f32[16,8]{1,0}) %all-gather-start)
  %all-reduce-start = f32[16,8]{1,0} all-reduce-start(%all-gather-done), channel_id=2, replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%add
  %all-reduce-done = f32[16,8]{1,0} all-reduce-done(%all-reduce-start)
  %cp-start = (f32[16,8]{1,0}, f32[16,8]{1,0}, u32[], u32[]) collective-permute-start(%all-reduce-done), channel_id=3, source_target_pairs={{0,1},{1,0}}
  %cp-done = f32[16,8]{1,0} collective-permute-done(%cp-start)
  %c = bf16[8,4]{1,0} constant({...})
  %a2a-start = ((bf16[8,4]{1,0}), bf16[8,4]{1,0}) async-start(%c), calls=%wrapped_all_to_all
  %a2a-done = bf16[8,4]{1,0} async-done(%a2a-start)
  ROOT %t = (f32[16,8]{1,0}, bf16[8,4]{1,0}) tuple(%cp-done, %a2a-done)
}
"""  # noqa: E501 (HLO lines are long)


def test_async_pairs_count_once_with_the_done_shape():
    rows = book.hlo.collectives(ASYNC_HLO)
    assert [r.op for r in rows] == ["all-to-all", "all-gather", "all-reduce", "collective-permute"]
    a2a, gather, reduce, permute = rows
    assert (a2a.shape, a2a.dtype, a2a.bytes) == ((8, 4), "bfloat16", 64)
    assert a2a.groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert (gather.shape, gather.bytes, gather.groups) == ((16, 8), 512, ALL)
    assert reduce.groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert (permute.bytes, permute.groups) == (512, ((0, 1), (1, 0)))


def test_graph_of_async_text_shows_each_collective_once():
    diagram = book.hlo.graph(ASYNC_HLO)
    for op in ("all-gather", "all-reduce", "collective-permute", "all-to-all"):
        assert diagram.source.count(f'label="{op}\\n') == 1, op
    assert "-start" not in diagram.source and "-done" not in diagram.source


@pytest.mark.parametrize(
    "groups,expected",
    [
        ("{}", ALL),
        ("{{0,2},{1,3}}", ((0, 2), (1, 3))),
        ("[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7))),
        ("[4,2]<=[2,2,2]T(0,2,1)", ((0, 2), (1, 3), (4, 6), (5, 7))),
        ("mesh['a'=2,'b'=4] {'a'}", ((0, 4), (1, 5), (2, 6), (3, 7))),
        ("mesh[a=2,b=4] {b}", ((0, 1, 2, 3), (4, 5, 6, 7))),
        ("mesh['a'=2,'b'=4] {'a','b'}", ALL),
        # b=4 seen as 2 x 2: b:(1)2 is its major half (b index differs by 2), b:(2)2 the minor.
        ("mesh['a'=2,'b'=4] {'b':(1)2}", ((0, 2), (1, 3), (4, 6), (5, 7))),
        ("mesh['a'=2,'b'=4] {'b':(2)2}", ((0, 1), (2, 3), (4, 5), (6, 7))),
        ("mesh['a'=2,'b'=4] {'a','b':(2)2}", ((0, 1, 4, 5), (2, 3, 6, 7))),
        ("mesh['x'=8], device_ids=([2,4]T(1,0)) {'x'}", ((0, 4, 1, 5, 2, 6, 3, 7),)),
        ("mesh['x'=4], device_ids=(3,2,1,0) {'x'}", ((3, 2, 1, 0),)),
    ],
)
def test_replica_group_notations(groups, expected):
    text = (
        "HloModule m, num_partitions=8\n\nENTRY %main (p: f32[4]) -> f32[4] {\n"
        "  %p = f32[4]{0} parameter(0)\n"
        f"  ROOT %r = f32[4]{{0}} all-reduce(%p), channel_id=1, replica_groups={groups}, "
        "use_global_device_ids=true, to_apply=%add\n}\n"
    )
    (row,) = book.hlo.collectives(text)
    assert row.groups == expected


def test_sub_axis_groups_match_xla_on_a_real_program():
    # On 2x4, resharding P('a','b') -> P('b','a') makes XLA group by a sub-axis.
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    x = put((8, 8), mesh, P("a", "b"))
    lowered = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P("b", "a"))).lower(x)
    text = lowered.compile().as_text()
    assert ":(" in text, "expected a sub-axis in the mesh-axes notation"
    old = book.hlo.collectives(lowered.compile(compiler_options=LEGACY_GROUPS))
    assert [r.groups for r in book.hlo.collectives(text)] == [r.groups for r in old]


def test_table_and_graph_render(mesh):
    a = put((16, 32), mesh, P(None, "x"))
    b = put((32, 8), mesh, P("x", None))
    compiled = jax.jit(lambda a, b: jnp.tanh(a @ b)).lower(a, b).compile()
    table = book.hlo.collective_table(compiled, title="matmul")
    assert isinstance(table, Rendered)
    assert "all-reduce" in table.html and "512" in table.html
    assert "all-reduce" in repr(table) and "total" in repr(table)
    diagram = book.hlo.graph(compiled)
    assert isinstance(diagram, Diagram)
    assert "all-reduce" in diagram.source
    assert "fused_computation" not in diagram.source, "fusions should be collapsed to one node"
    assert "fusion: dot" in diagram.source
    assert "all-reduce" in repr(diagram)
    if diagram.svg is not None:
        assert diagram.svg.lstrip().startswith("<?xml") or "<svg" in diagram.svg


def test_table_helper_aligns_text_and_escapes_html():
    rendered = book.hlo.table(["name", "bytes"], [["<a>", 1024], ["b", 8]], title="t")
    assert "&lt;a&gt;" in rendered.html and "1,024" in rendered.html
    assert repr(rendered).splitlines() == ["t", "name  bytes", "<a>   1,024", "b     8"]


def test_listing_keeps_shapes_shardings_and_groups_and_drops_the_rest(mesh2d):
    x = put((16, 32), mesh2d, P("a", None))
    w = put((32, 8), mesh2d, P(None, "b"))
    fn = jax.jit(lambda x, w: jnp.tanh(x @ w), out_shardings=NamedSharding(mesh2d, P()))
    compiled = fn.lower(x, w).compile()
    text = book.hlo.listing(compiled)
    assert "sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}" in text
    assert "metadata=" not in text and "{1,0}" not in text and "channel_id" not in text
    assert all(len(line) <= 88 for line in text.splitlines())
    params = [r for r in book.hlo.instructions(compiled) if r.op == "parameter"]
    assert [r.shape for r in params] == [(8, 32), (32, 2)]
    gathers = book.hlo.instructions(compiled, "all-gather")  # over b, then over a
    assert [g.type for g in gathers] == ["f32[8,8]", "f32[16,8]"] and gathers[-1].root
    assert all(any(d.startswith("replica_groups=") for d in g.details) for g in gathers)
    shown = "\n".join(g.text() for g in gathers)
    assert book.hlo.listing(compiled, ops="all-gather") == shown


def test_a_fused_dynamic_slice_is_found_inside_its_fusion(mesh):
    a = put((16, 32), mesh, P(None, "x"))
    b = put((32, 8), mesh, P("x", None))
    compiled = jax.jit(jnp.matmul, out_shardings=NamedSharding(mesh, P("x"))).lower(a, b).compile()
    (reduce,) = book.hlo.instructions(compiled, "all-reduce")
    (cut,) = book.hlo.instructions(compiled, "dynamic-slice")  # CPU: all-reduce, then a slice
    assert cut.shape == (2, 8) and f"%{reduce.name}" in cut.operands
    assert "dynamic-slice" in cut.text()


def test_listing_abbreviates_array_literals():
    text = """HloModule m

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %c = f32[4]{0} constant({1, 2, 3, 4})
  %z = f32[] constant(0)
  ROOT %s = f32[4]{0} add(%p, %c)
}
"""
    assert book.hlo.listing(text).splitlines() == [
        "%p = f32[4] parameter(0)",
        "%c = f32[4] constant(…)",
        "%z = f32[] constant(0)",
        "ROOT %s = f32[4] add(%p, %c)",
    ]


def test_stablehlo_listing_shows_argument_shardings_one_op_a_line(mesh2d):
    x = put((16, 32), mesh2d, P("a", None))
    fn = jax.jit(lambda x: jax.lax.with_sharding_constraint(2 * x, NamedSharding(mesh2d, P("b"))))
    text = book.hlo.stablehlo_listing(fn.lower(x))
    lines = text.splitlines()
    assert lines[0] == "@main("
    assert lines[1] == '    %arg0: tensor<16x32xf32> sharding<@mesh, [{"a"}, {}]>'
    assert lines[2].startswith(") -> tensor<16x32xf32>")
    assert any("sdy.sharding_constraint" in line and '[{"b"}, {}]' in line for line in lines)
    assert any(line.strip().startswith("return") for line in lines)
    assert all(len(line) <= 88 for line in lines)


def test_table_note_goes_under_the_table():
    rendered = book.hlo.table(["a"], [[1]], note="¹ a footnote")
    assert rendered.html.endswith("<p class='bk-hlo-note'>¹ a footnote</p>")
    assert repr(rendered).splitlines()[-1] == "¹ a footnote"
