"""book.hlo, and book.display's views of it, on programs whose communication is known.

The programs are compiled for the 8 mock CPU devices.
"""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import book.display
import book.hlo
from book.display import Diagram, Rendered

ALL = (tuple(range(8)),)
# Ask XLA for its older replica-group notations (lists and iota tiles) instead of mesh axes,
# so the parsers can be checked against each other on the same program. Newer XLA (jax 0.12)
# has this option; older XLA (jax 0.10) refuses it, and there the checks against the groups a
# program's shardings imply (below) stand alone.
LEGACY_GROUPS = {"xla_enable_rgv3_materialization": False}


def compile_with_older_notations(lowered):
    """The program compiled with lists and iota tiles for its groups, or a skip on older XLA."""
    try:
        return lowered.compile(compiler_options=LEGACY_GROUPS)
    except jax.errors.JaxRuntimeError as err:
        if "No such compile option" not in str(err):
            raise
        pytest.skip("this XLA has no option for the older notations (jax 0.10 prints mesh axes)")


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
    assert row.shapes == ((8,),)
    assert row.dtype == "float32"
    assert row.bytes == 8 * 4
    assert row.groups == ALL
    assert row.group_size == 8


def test_matmul_with_contraction_dim_sharded_all_reduces_the_product(mesh):
    a = put((16, 32), mesh, P(None, "x"))
    b = put((32, 8), mesh, P("x", None))
    compiled = jax.jit(jnp.matmul).lower(a, b).compile()
    (row,) = book.hlo.collectives(compiled)
    assert (row.op, *row.shapes, row.bytes, row.groups) == ("all-reduce", (16, 8), 16 * 8 * 4, ALL)


def test_ring_ppermute_is_a_collective_permute_with_its_pairs(mesh):
    ring = [(i, (i + 1) % 8) for i in range(8)]
    f = jax.shard_map(
        lambda x: jax.lax.ppermute(x, "x", ring), mesh=mesh, in_specs=P("x"), out_specs=P("x")
    )
    # int8, one byte an element; (the CPU compiler widens bf16 collectives to f32.)
    x = put((16, 8), mesh, P("x", None), jnp.int8)
    (row,) = book.hlo.collectives(jax.jit(f).lower(x).compile())
    assert row.op == "collective-permute"
    assert row.shapes == ((2, 8),)
    assert row.dtype == "int8"
    assert row.bytes == 2 * 8 * 1
    assert row.groups == tuple(ring)


def test_all_gather_result_is_the_full_array(mesh):
    x = put((16, 8), mesh, P("x", None))
    compiled = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P())).lower(x).compile()
    assert [(r.op, *r.shapes, r.bytes) for r in book.hlo.collectives(compiled)] == [
        ("all-gather", (16, 8), 16 * 8 * 4)
    ]


def test_all_to_all_tuple_result_sums_its_parts(mesh):
    x = put((16, 8), mesh, P("x", None))
    out = NamedSharding(mesh, P(None, "x"))
    (row,) = book.hlo.collectives(jax.jit(lambda x: x, out_shardings=out).lower(x).compile())
    assert row.op == "all-to-all"
    assert len(row.shapes) > 1 and all(len(s) == 3 for s in row.shapes)
    assert row.bytes == sum(int(np.prod(s)) for s in row.shapes) * 4 == 2 * 8 * 4


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
    assert (row.op, *row.shapes, row.bytes, row.groups) == ("reduce-scatter", (2, 8), 64, ALL)


def pieces(x, dim: int) -> list[tuple[int, ...]]:
    """The groups a collective combining ``x`` along ``dim`` must have, from its sharding alone.

    For an ``x`` with no replicated copies: devices whose blocks agree on every other dimension
    hold the pieces of one slice along ``dim``, so they form a group; its members are in the
    order of their pieces, which is the order an all-gather concatenates them in. Members are
    positions in the mesh's device order.
    """
    position = {d: k for k, d in enumerate(x.sharding.mesh.devices.flat)}
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for device, index in x.sharding.devices_indices_map(x.shape).items():
        rest = tuple((s.start, s.stop) for k, s in enumerate(index) if k != dim)
        groups.setdefault(rest, []).append((index[dim].start or 0, position[device]))
    return sorted(tuple(p for _, p in sorted(g)) for g in groups.values())


# (name, source spec, what the program does, the dimension it combines along): collectives
# whose groups the shardings imply.
COMBINING = [
    ("sum over a", P("a", "b"), lambda x: x.sum(0), 0),
    ("sum over b", P("a", "b"), lambda x: x.sum(1), 1),
    ("sum over (b,a)", P(("b", "a")), lambda x: x.sum(0), 0),
    ("sum over (a,b)", P(("a", "b")), lambda x: x.sum(0), 0),
    ("gather (b,a)", P(("b", "a")), "replicate", 0),
    ("gather (a,b)", P(("a", "b")), "replicate", 0),
]


@pytest.mark.parametrize("name,spec,f,dim", COMBINING, ids=[c[0] for c in COMBINING])
def test_groups_are_the_devices_whose_pieces_combine(mesh2d, name, spec, f, dim):
    x = put((8, 8), mesh2d, spec)
    if f == "replicate":
        f = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh2d, P()))
    (row,) = book.hlo.collectives(jax.jit(f).lower(x).compile())
    assert row.op == ("all-gather" if "gather" in name else "all-reduce")
    assert sorted(row.groups) == pieces(x, dim), name


def test_partial_sums_add_within_mesh_rows_and_gather_along_columns(mesh2d):
    # Chapter 3's perceptron: jax 0.10 prints the all-reduce's groups as explicit lists, 0.12 as
    # an iota tile, and the all-gather's as mesh axes in both.
    x = put((16, 32), mesh2d, P("a", None))
    w1 = put((32, 64), mesh2d, P(None, "b"))
    w2 = put((64, 32), mesh2d, P("b", None))
    mlp = jax.jit(
        lambda x, w1, w2: jnp.maximum(x @ w1, 0) @ w2, out_shardings=NamedSharding(mesh2d, P())
    )
    reduce, gather = book.hlo.collectives(mlp.lower(x, w1, w2).compile())
    assert (reduce.op, gather.op) == ("all-reduce", "all-gather")
    assert reduce.groups == ((0, 1, 2, 3), (4, 5, 6, 7))  # the rows of the mesh: over b
    assert gather.groups == ((0, 4), (1, 5), (2, 6), (3, 7))  # its columns: over a, the batch


def test_gathering_a_2d_block_layout_goes_one_axis_at_a_time(mesh2d):
    x = put((8, 8), mesh2d, P("a", "b"))
    compiled = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh2d, P())).lower(x).compile()
    rows = book.hlo.collectives(compiled)
    assert [r.op for r in rows] == ["all-gather", "all-gather"]
    assert {tuple(sorted(r.groups)) for r in rows} == {tuple(pieces(x, 0)), tuple(pieces(x, 1))}


# Reshardings whose groups XLA chooses, with the groups jax 0.10 and 0.12 both produce (each
# prints them in its own notation: mesh axes with device_ids= in 0.10, sub-axes in 0.12).
PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7))  # mesh neighbours along b's minor half
RESHARDS = [
    ("a,b -> b,a", P("a", "b"), P("b", "a"), {"all-to-all": PAIRS}),
    ("b,a -> a,b", P("b", "a"), P("a", "b"), {"all-to-all": PAIRS}),
    ("a,b -> b,None", P("a", "b"), P("b", None), {"all-to-all": ((0, 1, 2, 3), (4, 5, 6, 7))}),
    ("(b,a) -> b", P(("b", "a")), P("b"), {"all-gather": ((0, 4), (1, 5), (2, 6), (3, 7))}),
]


@pytest.mark.parametrize("name,src,dst,expected", RESHARDS, ids=[r[0] for r in RESHARDS])
def test_resharding_groups_read_the_same_in_every_notation(mesh2d, name, src, dst, expected):
    x = put((8, 8), mesh2d, src)
    lowered = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh2d, dst)).lower(x)
    rows = book.hlo.collectives(lowered.compile())
    for op, groups in expected.items():
        assert [sorted(r.groups) for r in rows if r.op == op] == [sorted(groups)], name
    for r in rows:  # every collective but a permute splits the 8 devices into equal groups
        if r.op != "collective-permute":
            assert sorted(d for g in r.groups for d in g) == list(range(8)), (name, r)


@pytest.mark.parametrize("name,src,dst,expected", RESHARDS, ids=[r[0] for r in RESHARDS])
def test_mesh_axes_groups_match_the_older_notations(mesh2d, name, src, dst, expected):
    x = put((8, 8), mesh2d, src)
    lowered = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh2d, dst)).lower(x)
    new = book.hlo.collectives(lowered.compile())
    old = book.hlo.collectives(compile_with_older_notations(lowered))
    # The order in which a collective's groups are listed means nothing; their members' does.
    assert [(r.op, sorted(r.groups), r.bytes) for r in new] == [
        (r.op, sorted(r.groups), r.bytes) for r in old
    ]


def test_reduction_over_flattened_axes_matches_the_older_notation(mesh2d):
    x = put((8, 8), mesh2d, P(("b", "a")))
    lowered = jax.jit(lambda x: x.sum(0)).lower(x)
    (new,) = book.hlo.collectives(lowered.compile())
    (old,) = book.hlo.collectives(compile_with_older_notations(lowered))
    assert new.groups == old.groups == ((0, 4, 1, 5, 2, 6, 3, 7),)


def test_the_installed_xla_prints_groups_this_module_reads(mesh, mesh2d):
    """Every group notation in these programs parses, and mesh axes are among them.

    A notation this module does not know makes ``collectives`` raise, so a JAX whose XLA
    prints groups a new way fails here rather than in a chapter.
    """
    programs = [(put((8, 8), mesh2d, src), dst) for _, src, dst, _ in RESHARDS]
    programs += [(put((8, 8), mesh2d, P("a", "b")), P()), (put((16, 8), mesh, P("x")), P())]
    printed = []
    for x, dst in programs:
        out = NamedSharding(x.sharding.mesh, dst)
        compiled = jax.jit(lambda x: x, out_shardings=out).lower(x).compile()
        assert book.hlo.collectives(compiled)
        for inst in book.hlo.instructions(compiled):
            printed += [d for d in inst.details if d.startswith("replica_groups=")]
    kinds = {re.match(r"replica_groups=(mesh\[|\[|\{)", d).group(1) for d in printed}
    assert "mesh[" in kinds, printed
    mesh_axes = [d for d in printed if d.startswith("replica_groups=mesh[")]
    # Beyond one plain axis: device_ids= (jax 0.10), several axes or a sub-axis (both).
    assert any("device_ids=" in d or ":(" in d or "','" in d for d in mesh_axes), mesh_axes


def test_no_collectives_when_every_device_has_its_data(mesh):
    x = put((16, 8), mesh, P("x", None))
    compiled = jax.jit(lambda x: 2 * x + 1).lower(x).compile()
    assert book.hlo.collectives(compiled) == []
    assert "No collectives" in repr(book.display.collective_table(compiled))


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
    assert (a2a.shapes, a2a.dtype, a2a.bytes) == (((8, 4),), "bfloat16", 64)
    assert a2a.groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert (gather.shapes, gather.bytes, gather.groups) == (((16, 8),), 512, ALL)
    assert reduce.groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert (permute.bytes, permute.groups) == (512, ((0, 1), (1, 0)))


def test_graph_of_async_text_shows_each_collective_once():
    diagram = book.display.hlo_graph(ASYNC_HLO)
    for op in ("all-gather", "all-reduce", "collective-permute", "all-to-all"):
        assert diagram.source.count(f'label="{op}\\n') == 1, op
    assert "-start" not in diagram.source and "-done" not in diagram.source


# Each notation as XLA prints it, with the groups worked out by hand from XLA's definition
# (xla/hlo/ir/replica_group.cc): the mesh's devices reshaped so that each selected (sub-)axis
# is a dimension, the selected ones moved last in the order listed, one group per row.
NOTATIONS = [
    ("explicit lists (jax 0.10)", "{{0,1,2,3},{4,5,6,7}}", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("empty list: everyone", "{}", ALL),
    ("explicit pairs", "{{0,2},{1,3}}", ((0, 2), (1, 3))),
    ("iota (jax 0.12)", "[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("iota, transposed (both)", "[4,2]<=[2,4]T(1,0)", ((0, 4), (1, 5), (2, 6), (3, 7))),
    ("iota, 3-d transpose (both)", "[4,2]<=[2,2,2]T(0,2,1)", ((0, 2), (1, 3), (4, 6), (5, 7))),
    (
        "mesh, own names (jax 0.12)",
        "mesh['data'=2,'model'=4] {'data'}",
        ((0, 4), (1, 5), (2, 6), (3, 7)),
    ),
    (
        "mesh, axis_N names (jax 0.10)",
        "mesh['axis_0'=2,'axis_1'=4] {'axis_1'}",
        ((0, 1, 2, 3), (4, 5, 6, 7)),
    ),
    ("mesh, unquoted (XLA's tests)", "mesh[a=2,b=4] {b}", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("mesh, one axis (jax 0.12)", "mesh['x'=8] {'x'}", ALL),
    ("mesh, size-1 axis (jax 0.10)", "mesh['axis_0'=8,'axis_1'=1] {'axis_0'}", ALL),
    ("mesh, both axes", "mesh['a'=2,'b'=4] {'a','b'}", ALL),
    # Listed b first: a group's members run along b first, as P(('b', 'a')) orders its blocks.
    (
        "mesh, axes out of order (jax 0.12)",
        "mesh['a'=2,'b'=4] {'b','a'}",
        ((0, 4, 1, 5, 2, 6, 3, 7),),
    ),
    # b=4 seen as 2 x 2: b:(1)2 is its major half (b index differs by 2), b:(2)2 the minor.
    ("sub-axis, major half", "mesh['a'=2,'b'=4] {'b':(1)2}", ((0, 2), (1, 3), (4, 6), (5, 7))),
    ("sub-axis, minor half (jax 0.12)", "mesh['a'=2,'b'=4] {'b':(2)2}", PAIRS),
    ("axis and sub-axis", "mesh['a'=2,'b'=4] {'a','b':(2)2}", ((0, 1, 4, 5), (2, 3, 6, 7))),
    (
        "two sub-axes, minor first",
        "mesh['a'=2,'b'=4] {'b':(2)2,'b':(1)2}",
        ((0, 2, 1, 3), (4, 6, 5, 7)),
    ),
    # jax 0.10 names the compiler's own meshes and gives their device order as an iota tile.
    (
        "device_ids, flattened (jax 0.10)",
        "mesh['axis_0'=8,'axis_1'=1], device_ids=([2,4]T(1,0)) {'axis_0'}",
        ((0, 4, 1, 5, 2, 6, 3, 7),),
    ),
    (
        "device_ids, sub-axis (jax 0.10)",
        "mesh['axis_0'=4,'axis_1'=2], device_ids=([2,2,2]T(0,2,1)) {'axis_0':(2)2}",
        PAIRS,
    ),
    (
        "device_ids, sub-axis 2 (jax 0.10)",
        "mesh['axis_0'=2,'axis_1'=4], device_ids=([2,2,2]T(1,0,2)) {'axis_1':(2)2}",
        ((0, 1), (4, 5), (2, 3), (6, 7)),
    ),
    (
        "device_ids, 3 axes (jax 0.10)",
        "mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}",
        ((0, 1, 2, 3), (4, 5, 6, 7)),
    ),
    (
        "device_ids, whole axis",
        "mesh['x'=8], device_ids=([2,4]T(1,0)) {'x'}",
        ((0, 4, 1, 5, 2, 6, 3, 7),),
    ),
    ("device_ids as a list", "mesh['x'=4], device_ids=(3,2,1,0) {'x'}", ((3, 2, 1, 0),)),
    ("device_ids as a 2-d list", "mesh[a=2,b=2], device_ids=(0,2,1,3) {a}", ((0, 1), (2, 3))),
    ("mesh, nothing selected", "mesh['a'=2,'b'=4] {}", tuple((d,) for d in range(8))),
    ("maximal mesh", "maximal_mesh[device_id=3] {}", ((3,),)),
]


@pytest.mark.parametrize("name,groups,expected", NOTATIONS, ids=[n[0] for n in NOTATIONS])
def test_replica_group_notations(name, groups, expected):
    text = (
        "HloModule m, num_partitions=8\n\nENTRY %main (p: f32[4]) -> f32[4] {\n"
        "  %p = f32[4]{0} parameter(0)\n"
        f"  ROOT %r = f32[4]{{0}} all-reduce(%p), channel_id=1, replica_groups={groups}, "
        "use_global_device_ids=true, to_apply=%add\n}\n"
    )
    (row,) = book.hlo.collectives(text)
    assert row.groups == expected
    (inst,) = book.hlo.instructions(text, "all-reduce")
    assert inst.details == (f"replica_groups={groups}",), "the listing keeps the whole notation"


def test_an_unknown_notation_is_an_error_not_a_guess():
    text = (
        "HloModule m\n\nENTRY %main (p: f32[4]) -> f32[4] {\n  %p = f32[4]{0} parameter(0)\n"
        "  ROOT %r = f32[4]{0} all-reduce(%p), replica_groups=ring<8>, to_apply=%add\n}\n"
    )
    with pytest.raises(ValueError, match="Cannot read replica groups"):
        book.hlo.collectives(text)


def test_sub_axis_groups_match_xla_on_a_real_program():
    # On 2x4, resharding P('a','b') -> P('b','a') makes XLA group by a sub-axis.
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    x = put((8, 8), mesh, P("a", "b"))
    lowered = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P("b", "a"))).lower(x)
    text = lowered.compile().as_text()
    assert ":(" in text, "expected a sub-axis in the mesh-axes notation"
    old = book.hlo.collectives(compile_with_older_notations(lowered))
    assert [sorted(r.groups) for r in book.hlo.collectives(text)] == [sorted(r.groups) for r in old]


def test_table_and_graph_render(mesh):
    a = put((16, 32), mesh, P(None, "x"))
    b = put((32, 8), mesh, P("x", None))
    compiled = jax.jit(lambda a, b: jnp.tanh(a @ b)).lower(a, b).compile()
    table = book.display.collective_table(compiled, title="matmul")
    assert isinstance(table, Rendered)
    assert "all-reduce" in table.html and "512" in table.html
    assert "all-reduce" in repr(table) and "total" in repr(table)
    diagram = book.display.hlo_graph(compiled)
    assert isinstance(diagram, Diagram)
    assert "all-reduce" in diagram.source
    assert "fused_computation" not in diagram.source, "fusions should be collapsed to one node"
    # The product is a node of its own, fused (jax 0.12's CPU compiler) or not (jax 0.10's).
    assert re.search(r'label="(fusion: )?dot\\n', diagram.source), diagram.source
    assert "all-reduce" in repr(diagram)
    if diagram.svg is not None:
        assert diagram.svg.lstrip().startswith("<?xml") or "<svg" in diagram.svg


def test_listing_keeps_shapes_and_groups_and_drops_the_rest(mesh2d):
    x = put((16, 32), mesh2d, P("a", None))
    w = put((32, 8), mesh2d, P(None, "b"))
    fn = jax.jit(lambda x, w: jnp.tanh(x @ w), out_shardings=NamedSharding(mesh2d, P()))
    compiled = fn.lower(x, w).compile()
    text = book.display.listing(compiled)
    assert "metadata=" not in text and "{1,0}" not in text and "channel_id" not in text
    assert all(len(line) <= 88 for line in text.splitlines())
    params = [r for r in book.hlo.instructions(compiled) if r.op == "parameter"]
    assert [r.shapes for r in params] == [((8, 32),), ((32, 2),)]
    # A parameter's sharding is listed where this XLA prints it (jax 0.10 does, 0.12 does not);
    # the compiled program's input_shardings say it in every version.
    entry = compiled.as_text().split("\nENTRY ", 1)[1]
    for r in params:
        line = next(line for line in entry.splitlines() if f"%{r.name} = " in line)
        assert ("sharding=" in line) == any(d.startswith("sharding=") for d in r.details)
    assert [s.spec for s in compiled.input_shardings[0]] == [P("a", None), P(None, "b")]
    gathers = book.hlo.instructions(compiled, "all-gather")  # over b, then over a
    assert [g.type for g in gathers] == ["f32[8,8]", "f32[16,8]"] and gathers[-1].root
    assert all(any(d.startswith("replica_groups=") for d in g.details) for g in gathers)
    shown = "\n".join(book.display.instruction_text(g) for g in gathers)
    assert book.display.listing(compiled, ops="all-gather") == shown


def test_a_fused_dynamic_slice_is_found_inside_its_fusion(mesh):
    a = put((16, 32), mesh, P(None, "x"))
    b = put((32, 8), mesh, P("x", None))
    compiled = jax.jit(jnp.matmul, out_shardings=NamedSharding(mesh, P("x"))).lower(a, b).compile()
    (reduce,) = book.hlo.instructions(compiled, "all-reduce")
    (cut,) = book.hlo.instructions(compiled, "dynamic-slice")  # CPU: all-reduce, then a slice
    assert cut.shapes == ((2, 8),) and f"%{reduce.name}" in cut.operands
    assert "dynamic-slice" in book.display.instruction_text(cut)


def test_listing_abbreviates_array_literals():
    text = """HloModule m

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %c = f32[4]{0} constant({1, 2, 3, 4})
  %z = f32[] constant(0)
  ROOT %s = f32[4]{0} add(%p, %c)
}
"""
    assert book.display.listing(text).splitlines() == [
        "%p = f32[4] parameter(0)",
        "%c = f32[4] constant(…)",
        "%z = f32[] constant(0)",
        "ROOT %s = f32[4] add(%p, %c)",
    ]


def test_stablehlo_listing_shows_argument_shardings_one_op_a_line(mesh2d):
    x = put((16, 32), mesh2d, P("a", None))
    fn = jax.jit(lambda x: jax.lax.with_sharding_constraint(2 * x, NamedSharding(mesh2d, P("b"))))
    text = book.display.stablehlo_listing(fn.lower(x))
    lines = text.splitlines()
    assert lines[0] == "@main("
    assert lines[1] == '    %arg0: tensor<16x32xf32> sharding<@mesh, [{"a"}, {}]>'
    assert lines[2].startswith(") -> tensor<16x32xf32>")
    assert any("sdy.sharding_constraint" in line and '[{"b"}, {}]' in line for line in lines)
    assert any(line.strip().startswith("return") for line in lines)
    assert all(len(line) <= 88 for line in lines)


def test_compiler_messages_catch_what_native_code_writes_to_stderr(capfd):
    with book.hlo.compiler_messages() as log:
        os.write(2, b"W0000 spmd_partitioner.cc:1] [SPMD] Involuntary full rematerialization.\n")
    assert log.lines == ["W0000 spmd_partitioner.cc:1] [SPMD] Involuntary full rematerialization."]
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"  # nothing caught leaked, and fd 2 is back


def test_compiler_messages_give_fd_2_back_when_the_block_raises(capfd):
    with pytest.raises(ZeroDivisionError):
        with book.hlo.compiler_messages():
            raise ZeroDivisionError
    os.write(2, b"still here\n")
    assert capfd.readouterr().err == "still here\n"


def test_loop_trips_multiplies_a_loop_by_the_loops_around_it():
    def nested(x):
        def outer(c, _):
            return jax.lax.scan(lambda d, _: (jnp.sin(d) * 2, None), c, None, length=3)[0], None

        return jax.lax.scan(outer, x, None, length=4)[0]

    trips = book.hlo.loop_trips(jax.jit(nested).lower(jnp.ones(2)).compile())
    assert sorted(trips.values()) == [4, 12]  # the inner body runs 3 times per outer trip
    single = jax.jit(lambda x: jax.lax.scan(lambda c, _: (c * 2, None), x, None, length=5)[0])
    assert list(book.hlo.loop_trips(single.lower(jnp.ones(2)).compile()).values()) == [5]


def test_loop_trips_follows_a_conditional_branch_and_deep_nesting():
    def looped_cond(x):
        def body(i, x):
            inner = lambda y: jax.lax.fori_loop(0, 11, lambda j, z: z + 1, y)  # noqa: E731
            return jax.lax.cond(x.sum() > 0, inner, lambda y: y, x)

        return jax.lax.fori_loop(0, 4, body, x)

    trips = book.hlo.loop_trips(jax.jit(looped_cond).lower(jnp.ones(4)).compile())
    assert sorted(trips.values()) == [4, 44]  # the branch's loop, at most once per outer trip
    # 3,000 loops, each body calling the next: counted without recursion, absurd counts skipped.
    lines = []
    for i in range(3000):
        lines += [
            f"%b{i} (p: f32[]) -> f32[] {{",
            f"  %w = f32[] while(%p), condition=%c, body=%b{i + 1},"
            ' backend_config={"known_trip_count":{"n":"1"}}',
            "}",
        ]
    lines += ["ENTRY %main (x: f32[]) -> f32[] {", "  %w = f32[] while(%x), body=%b0,"
              ' backend_config={"known_trip_count":{"n":"1"}}',
              "  ROOT %v = f32[] while(%w), body=%bx,"
              ' backend_config={"known_trip_count":{"n":"' + "9" * 5000 + '"}}', "}"]  # fmt: skip
    deep = book.hlo.loop_trips("\n".join(lines))
    assert len(deep) == 3001 and set(deep.values()) == {1} and "bx" not in deep


def test_loop_trips_leaves_out_what_only_the_run_counts():
    def data_loop(x, n):
        def body(c):
            i, x = c
            return i + 1, jax.lax.fori_loop(0, 11, lambda j, z: z * 1.01, x)

        return jax.lax.while_loop(lambda c: c[0] < n, body, (0, x))[1]

    compiled = jax.jit(data_loop).lower(jnp.ones(4), 7).compile()
    assert book.hlo.loop_trips(compiled) == {}  # 11 per outer trip, n trips: unknown here


def test_loop_trips_reads_hand_written_text_and_refuses_stablehlo():
    text = (
        "%body (p: f32[]) -> f32[] {\n"
        "  %w = f32[] while(%p), condition=%cond, body=%body,"
        ' backend_config={"known_trip_count":{"n":"7"}}\n'
        "}\n"
        "ENTRY %main (x: f32[]) -> f32[] {\n  ROOT %c = f32[] call(%x), to_apply=%body\n}\n"
    )
    assert book.hlo.loop_trips(text) == {"body": 7}  # a body that calls itself stops, not recurses
    with pytest.raises(book.hlo.HloError, match="StableHLO"):
        book.hlo.loop_trips(jax.jit(jnp.sin).lower(1.0).as_text())


def test_compiler_messages_refuse_a_second_entry_and_keep_fd_2(capfd):
    log = book.hlo.compiler_messages()
    with log:
        with pytest.raises(book.hlo.HloError, match="already catching"):
            with log:
                pass
    with log:  # once left, the same object can be used again
        os.write(2, b"caught\n")
    assert log.lines == ["caught"]
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"


@pytest.mark.parametrize(
    "groups",
    [
        "replica_groups=[1,100000000000]<=[100000000000]",
        "replica_groups=mesh['a'=100000000000]{'a'}",
        "replica_groups=mesh['a'=8]{'a':(0)2}",
    ],
)
def test_replica_groups_past_any_machine_are_refused(groups):
    text = (
        "HloModule m, num_partitions=8\n\nENTRY %main (p: f32[8]) -> f32[8] {\n"
        "  %p = f32[8]{0} parameter(0)\n"
        f"  ROOT %ar = f32[8]{{0}} all-reduce(f32[8]{{0}} %p), {groups}, to_apply=%add\n}}\n"
    )
    with pytest.raises(book.hlo.HloError):
        book.hlo.collectives(text)
    huge = text.replace("num_partitions=8", "num_partitions=100000000000")
    with pytest.raises(book.hlo.HloError, match="more than any machine"):
        book.hlo.collectives(huge.replace(f", {groups}", ""))
    wide = text.replace("f32[8]{0} all-reduce", "f32[" + "9" * 5000 + "]{0} all-reduce")
    with pytest.raises(book.hlo.HloError):
        book.hlo.collectives(wide)


@pytest.mark.parametrize("axis", ["m,n", "m}", "x:(1)2"])
def test_a_mesh_axis_named_with_the_notations_separators_is_named(axis):
    mesh = jax.make_mesh((2, 4), ("x", axis), axis_types=(AxisType.Explicit,) * 2)
    x = jax.device_put(jnp.ones((2, 8)), NamedSharding(mesh, P("x", axis)))
    step = jax.shard_map(
        lambda v: jax.lax.psum(v, axis), mesh=mesh, in_specs=P("x", axis), out_specs=P("x")
    )
    with pytest.raises(book.hlo.HloError, match="rename the axis"):
        book.hlo.collectives(jax.jit(step).lower(x).compile())


def test_an_op_inside_a_loop_is_found_in_the_instruction_that_runs_the_loop():
    x = jnp.ones((8, 8))

    def doubled(x):
        return jax.lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, c[1] * 2), (0, x))[1]

    compiled = jax.jit(doubled).lower(x).compile()
    (runner,) = book.hlo.instructions(compiled, op="multiply")
    assert runner.op in ("while", "call") and "multiply" in runner.fused
    assert book.hlo.instructions(compiled, op="while") == [runner]


@pytest.mark.parametrize("text", ["", "hello world"])
def test_loop_trips_of_a_text_that_is_no_program_says_so(text):
    with pytest.raises(book.hlo.HloError, match="No HLO computations found"):
        book.hlo.loop_trips(text)
