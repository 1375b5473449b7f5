"""Shard tables show the values each device really holds; diagrams degrade to text."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from book import viz


def mesh(shape, names):
    return jax.make_mesh(shape, names, axis_types=(AxisType.Explicit,) * len(shape))


def put(values, m, spec):
    return jax.device_put(values, NamedSharding(m, spec))


def test_summary_of_a_2d_sharding():
    x = put(
        np.arange(32, dtype=np.float32).reshape(8, 4),
        mesh((2, 4), ("data", "model")),
        P("data", None),
    )
    s = viz.summarize(x)
    assert s.shard_shape == (4, 4)
    assert s.bytes_per_device == 4 * 4 * 4 and s.total_bytes == 32 * 4
    assert (s.devices, s.distinct_shards, s.replication) == (8, 2, 4)


def test_fully_replicated_and_fully_sharded():
    m = mesh((2, 4), ("data", "model"))
    assert viz.summarize(put(np.zeros((8, 4)), m, P())).replication == 8
    assert viz.summarize(put(np.zeros((8, 4)), m, P("data", "model"))).replication == 1


def test_table_shows_each_device_its_own_values():
    m = mesh((2, 4), ("data", "model"))
    x = put(np.arange(32).reshape(4, 8), m, P("data", "model"))
    table = viz.shard_table(x)
    # device 5 sits at data=1, model=1: rows 2:4, columns 2:4
    assert "device 5 x[2:4, 2:4]:\n[[18 19]\n [26 27]]" in repr(table)
    assert "<b>device 5</b>" in table._repr_html_()
    assert "16 of 128 bytes per device" in repr(table)


def test_three_dimensional_arrays():
    m = mesh((2, 2, 2), ("a", "b", "c"))
    x = put(np.arange(64).reshape(4, 4, 4), m, P("a", None, "c"))
    table = viz.shard_table(x)
    assert "[1, :, :]" in table.html  # a rank-3 shard shown as its 2D slices
    assert "each shard held by 2 devices" in table.text
    for shard in x.addressable_shards:
        assert f"device {shard.device.id} x[" in table.text


def test_hiding_device_ids():
    x = put(np.arange(8), mesh((8,), ("data",)), P("data"))
    assert "device 3" not in viz.shard_table(x, show_ids=False).text


def test_the_table_names_the_array():
    x = put(np.arange(8), mesh((8,), ("data",)), P("data"))
    table = viz.shard_table(x, name="w1")
    assert "device 3 w1[3:4]:" in table.text
    assert "<span class='bk-idx'>w1[3:4]</span>" in table.html
    assert " x[" not in table.text


def test_large_shards_are_trimmed():
    x = put(np.arange(64 * 64).reshape(64, 64), mesh((2, 4), ("data", "model")), P())
    assert "…" in viz.shard_table(x).html


def test_mesh_diagram_shows_device_order():
    m = jax.sharding.Mesh(np.array(jax.devices())[[0, 1, 2, 3, 6, 7, 4, 5]], ("ring",))
    d = viz.mesh_diagram(m)
    assert "0   1   2   3   6   7   4   5" in repr(d)
    assert 'pos="360,0"' in d.source  # device 6 is fifth along the axis


@pytest.mark.skipif(not viz.shutil.which("neato"), reason="Graphviz is not installed")
def test_diagrams_render_to_svg():
    m = mesh((2, 4), ("data", "model"))
    assert viz.mesh_diagram(m)._repr_svg_().lstrip().startswith("<?xml")
    assert "<svg" in viz.ring_diagram(["a", "b", "c"])._repr_svg_()


def test_diagrams_fall_back_to_text_without_graphviz(monkeypatch):
    monkeypatch.setattr(viz.shutil, "which", lambda name: None)
    ring = viz.ring_diagram([0, 1, 2, 3, 6, 7, 4, 5], title="TPU v3-8")
    assert ring._repr_svg_() is None
    assert repr(ring) == "TPU v3-8: 0 -> 1 -> 2 -> 3 -> 6 -> 7 -> 4 -> 5 -> 0"


def test_wrong_kinds_of_things_get_one_sentence():
    from book.errors import ReaderError

    m = mesh((2, 4), ("data", "model"))
    cases = [
        (lambda: viz.shard_table(np.zeros(8)), "must be a jax.Array, placed with jax.device_put"),
        (lambda: viz.summarize([1, 2]), "must be a jax.Array"),
        (lambda: viz.shard_table(put(np.zeros(8), m, P()), show_ids="no"), "True or False"),
        (lambda: viz.mesh_diagram("2x4"), "jax.sharding.Mesh"),
        (lambda: viz.ring_diagram([]), "non-empty list"),
        (lambda: viz.ring_diagram(["a", "b"], groups=[0]), "one entry per label"),
        (lambda: viz.before_after_table([np.arange(2)], [np.arange(2)] * 2), "one per device"),
        (lambda: viz.collective_diagram([np.arange(2)], [np.arange(2)], reduce="max"), "sum"),
        (lambda: viz.trace_moves("ab", "ab"), "Pass a jax.Array"),
    ]
    for call, words in cases:
        with pytest.raises(ReaderError, match=words) as caught:
            call()
        assert "\n" not in str(caught.value)
