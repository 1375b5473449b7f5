"""Before/after tables and data-movement diagrams of collectives, drawn from real values."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from book import display, shards


@pytest.fixture(scope="module")
def line():
    return jax.make_mesh((8,), ("i",), axis_types=(AxisType.Explicit,))


def run(mesh, body, x):
    f = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return jax.jit(f)(x)


def blocks_of(mesh, values):
    return jax.device_put(values, NamedSharding(mesh, P("i")))


def test_device_blocks_follow_the_mesh_and_label_positions(line):
    x = blocks_of(line, np.arange(16))
    blocks = shards.device_blocks(x)
    assert [label for label, _ in blocks][:2] == ["device 0 (i=0)", "device 1 (i=1)"]
    np.testing.assert_array_equal(blocks[3][1], [6, 7])


def test_table_has_one_row_per_device(line):
    x = blocks_of(line, 100 + np.arange(16))
    y = run(line, lambda b: jax.lax.psum(b, "i"), x)
    table = display.before_after_table(x, y, title="psum")
    assert table.html.count("class='bk-dev") == 3 * 8
    assert "device 7 (i=7): [114 115] -> [856 864]" in table.text


def test_table_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="one per device"):
        display.before_after_table([np.zeros(2)] * 8, [np.zeros(2)] * 7)


def test_ppermute_shift_is_traced_with_its_zeros(line):
    x = blocks_of(line, 1 + np.arange(16))
    y = run(line, lambda b: jax.lax.ppermute(b, "i", [(k, k + 1) for k in range(7)]), x)
    moves, zeros = shards.trace_moves(x, y)
    assert moves == {(k, k + 1): [2 * k + 1, 2 * k + 2] for k in range(7)}
    assert zeros == {0}
    diagram = display.collective_diagram(x, y, title="shift")
    assert diagram.source.count("->") == 7
    assert "device 0 (i=0): zeros, nobody sent to it" in diagram.text


def test_all_gather_sends_every_block_everywhere(line):
    x = blocks_of(line, np.arange(16))
    y = run(line, lambda b: jax.lax.all_gather(b, "i"), x)
    moves, zeros = shards.trace_moves(x, y)
    assert sorted(moves) == [(s, d) for s in range(8) for d in range(8)] and not zeros
    diagram = display.collective_diagram(x, y)
    assert " label=" not in diagram.source.split("->", 1)[1]
    # without Graphviz the text says it in one line per sender, not one per arrow
    assert diagram.text.splitlines() == [
        f"device {k} (i={k}) -> every device: {2 * k} {2 * k + 1}" for k in range(8)
    ]


def test_the_text_of_many_moves_is_cut_short(line):
    m = blocks_of(line, np.arange(64).reshape(8, 8))
    y = run(line, lambda b: jax.lax.all_to_all(b, "i", 1, 1, tiled=True), m)
    lines = display.collective_diagram(m, y).text.splitlines()
    assert len(lines) == 17 and lines[-1] == "… and 48 more moves"


def test_reductions_are_drawn_through_one_node_and_checked(line):
    m = blocks_of(line, np.arange(64).reshape(8, 8))
    y = run(line, lambda b: jax.lax.psum_scatter(b, "i", scatter_dimension=1, tiled=True), m)
    diagram = display.collective_diagram(m, y, reduce="sum")
    assert "part 3 of dim 1" in diagram.source
    assert "device 3 (i=3) keeps part 3 of dim 1: [248]" in diagram.text
    with pytest.raises(ValueError, match="neither the mean"):
        display.collective_diagram(m, y, reduce="mean")


def test_reduction_groups_get_one_node_each():
    before = [np.array([k]) for k in range(4)]
    after = [np.array([2]), np.array([4]), np.array([2]), np.array([4])]
    diagram = display.collective_diagram(before, after, reduce="sum", groups=[[0, 2], [1, 3]])
    assert "r0 ->" in diagram.source and "r1 ->" in diagram.source


def test_untraceable_values_are_explained():
    with pytest.raises(ValueError, match="appears twice"):
        shards.trace_moves([np.array([1, 1])], [np.array([1, 1])])
    with pytest.raises(ValueError, match="reduce='sum'"):
        shards.trace_moves([np.array([1, 2])], [np.array([3, 3])])


def test_diagram_falls_back_to_text(line):
    x = blocks_of(line, 1 + np.arange(16))
    y = run(line, lambda b: jax.lax.ppermute(b, "i", [(k, (k + 1) % 8) for k in range(8)]), x)
    assert "device 7 (i=7) -> device 0 (i=0): 15 16" in repr(display.collective_diagram(x, y))


@pytest.mark.parametrize("as_array", [np.asarray, jax.numpy.asarray])
def test_complex_blocks_given_as_a_list_are_drawn_as_a_sharded_array_is(as_array):
    before = [as_array(np.array([1 + 1j, 2], np.complex64)), as_array(np.array([3 - 1j, 4]))]
    summed = display.collective_diagram(before, [before[0] + before[1]] * 2, reduce="sum")
    assert "[(4+0j) (6+0j)]" in str(summed)
    moves, _ = shards.trace_moves(before, before[::-1])
    assert moves[(0, 1)] == [1 + 1j, 2] and moves[(1, 0)] == [3 - 1j, 4]
