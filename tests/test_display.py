"""Tables, pictures and diagrams: real values, one stylesheet, text where Graphviz is missing."""

import shutil

import graphviz
import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from book import display, shards
from book.errors import ReaderError


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
    s = shards.summarize(x)
    assert s.shard_shape == (4, 4)
    assert s.bytes_per_device == 4 * 4 * 4 and s.total_bytes == 32 * 4
    assert (s.devices, s.distinct_shards, s.replication) == (8, 2, 4)


def test_fully_replicated_and_fully_sharded():
    m = mesh((2, 4), ("data", "model"))
    assert shards.summarize(put(np.zeros((8, 4)), m, P())).replication == 8
    assert shards.summarize(put(np.zeros((8, 4)), m, P("data", "model"))).replication == 1


def test_table_shows_each_device_its_own_values():
    m = mesh((2, 4), ("data", "model"))
    x = put(np.arange(32).reshape(4, 8), m, P("data", "model"))
    table = display.shard_table(x)
    # device 5 sits at data=1, model=1: rows 2:4, columns 2:4
    assert "device 5 x[2:4, 2:4]:\n[[18 19]\n [26 27]]" in repr(table)
    assert "<b>device 5</b>" in table._repr_html_()
    assert "16 of 128 bytes per device" in repr(table)


def test_three_dimensional_arrays():
    m = mesh((2, 2, 2), ("a", "b", "c"))
    x = put(np.arange(64).reshape(4, 4, 4), m, P("a", None, "c"))
    table = display.shard_table(x)
    assert "[1, :, :]" in table.html  # a rank-3 shard shown as its 2D slices
    assert "each shard held by 2 devices" in table.text
    for shard in x.addressable_shards:
        assert f"device {shard.device.id} x[" in table.text


def test_hiding_device_ids():
    x = put(np.arange(8), mesh((8,), ("data",)), P("data"))
    assert "device 3" not in display.shard_table(x, show_ids=False).text


def test_the_table_names_the_array():
    x = put(np.arange(8), mesh((8,), ("data",)), P("data"))
    table = display.shard_table(x, name="w1")
    assert "device 3 w1[3:4]:" in table.text
    assert "<span class='bk-idx'>w1[3:4]</span>" in table.html
    assert " x[" not in table.text


def test_the_summary_names_the_mesh_with_its_article():
    x = put(np.arange(8), mesh((8,), ("data",)), P("data"))
    assert "on an 8-device mesh ('data',)" in display.shard_table(x).text
    texts = [display.mesh_text(s) for s in [(2, 4), (8, 1), (11,), (18, 2), (110,), (4,)]]
    assert texts == [
        "a 2x4 mesh",
        "an 8x1 mesh",
        "an 11-device mesh",
        "an 18x2 mesh",
        "a 110-device mesh",
        "a 4-device mesh",
    ]


def test_large_shards_are_trimmed():
    x = put(np.arange(64 * 64).reshape(64, 64), mesh((2, 4), ("data", "model")), P())
    assert "…" in display.shard_table(x).html


def test_mesh_diagram_shows_device_order():
    m = jax.sharding.Mesh(np.array(jax.devices())[[0, 1, 2, 3, 6, 7, 4, 5]], ("ring",))
    d = display.mesh_diagram(m)
    assert "0   1   2   3   6   7   4   5" in repr(d)
    assert 'pos="360,0"' in d.source  # device 6 is fifth along the axis


@pytest.mark.skipif(not shutil.which("neato"), reason="Graphviz's neato is not installed")
def test_diagrams_render_to_svg():
    m = mesh((2, 4), ("data", "model"))
    bundle = display.mesh_diagram(m)._repr_mimebundle_()
    assert bundle["image/svg+xml"].lstrip().startswith("<?xml")
    assert "<svg" in display.ring_diagram(["a", "b", "c"]).svg


def test_diagrams_fall_back_to_text_without_graphviz(monkeypatch):
    def missing(*args, **kwargs):
        raise graphviz.ExecutableNotFound(["neato"])

    monkeypatch.setattr(graphviz.Digraph, "pipe", missing)
    ring = display.ring_diagram([0, 1, 2, 3, 6, 7, 4, 5], title="TPU v3-8")
    assert ring.svg is None
    assert repr(ring) == "TPU v3-8: 0 -> 1 -> 2 -> 3 -> 6 -> 7 -> 4 -> 5 -> 0"
    two_lines = display.ring_diagram(["core 0\nchip 0", "core 1\nchip 0"])
    assert repr(two_lines) == "core 0, chip 0 -> core 1, chip 0 -> core 0, chip 0"
    shown = ring._repr_mimebundle_()
    assert list(shown) == ["text/plain"]
    assert shown["text/plain"].endswith(display.NEEDS_DOT)
    mesh_text = display.mesh_diagram(mesh((2, 4), ("data", "model")))._repr_mimebundle_()
    assert "('data', 'model')" in mesh_text["text/plain"]  # the axis names survive
    cube = repr(display.mesh_diagram(mesh((2, 2, 2), ("pipe", "data", "model")), title="cube"))
    assert cube.splitlines() == [  # a 3D mesh as labelled 2D slices, its title once
        "cube ('pipe', 'data', 'model'), device ids:",
        "pipe=0:",
        " 0   1",
        " 2   3",
        "pipe=1:",
        " 4   5",
        " 6   7",
    ]


def test_one_stylesheet_shipped_in_the_package_and_linked_from_static():
    from importlib.resources import files

    from nbconventions import ROOT

    assert (ROOT / "_static" / "book.css").resolve() == (ROOT / "book" / "book.css").resolve()
    assert files("book").joinpath("book.css").read_text(encoding="utf-8") == display.STYLESHEET
    assert len(display.PALETTE) == 16


def test_each_output_embeds_the_stylesheet_once():
    x = put(np.arange(8), mesh((8,), ("data",)), P("data"))
    outputs = [
        display.shard_table(x)._repr_html_(),
        display.table(["a"], [[1]])._repr_html_(),
        display.before_after_table(x, x)._repr_html_(),
        display.verdict_html(False, "Not <yet>."),
    ]
    for shown in outputs:
        assert shown.count("<style>") == 1 and shown.startswith(f"<style>{display.STYLESHEET}")
        assert " style=" not in shown  # colours and layout come from the stylesheet


def test_table_text_is_laid_out_by_tabulate_and_html_escaped():
    rendered = display.table(["name", "bytes"], [["<a>", 1024], ["b", 8]], title="t", note="n")
    assert "&lt;a&gt;" in rendered.html and "1,024" in rendered.html
    assert repr(rendered).splitlines() == [
        "t",
        "name      bytes",
        "------  -------",
        "<a>       1,024",
        "b             8",
        "n",
    ]
    assert rendered.html.endswith("<p class='bk-note'>n</p>")


def test_wrong_kinds_of_things_get_one_sentence():
    from book.errors import ReaderError

    m = mesh((2, 4), ("data", "model"))
    cases = [
        (
            lambda: display.shard_table(np.zeros(8)),
            "must be a jax.Array, placed with jax.device_put",
        ),
        (lambda: shards.summarize([1, 2]), "must be a jax.Array"),
        (lambda: display.shard_table(put(np.zeros(8), m, P()), show_ids="no"), "True or False"),
        (lambda: display.mesh_diagram("2x4"), "jax.sharding.Mesh"),
        (lambda: display.ring_diagram([]), "non-empty list"),
        (lambda: display.ring_diagram(["a", "b"], groups=[0]), "one entry per label"),
        (lambda: display.before_after_table([np.arange(2)], [np.arange(2)] * 2), "one per device"),
        (lambda: display.collective_diagram([np.arange(2)], [np.arange(2)], reduce="max"), "sum"),
        (lambda: shards.trace_moves("ab", "ab"), "Pass a jax.Array"),
    ]
    for call, words in cases:
        with pytest.raises(ReaderError, match=words) as caught:
            call()
        assert "\n" not in str(caught.value)


def test_a_deleted_array_or_one_of_keys_gets_one_sentence():
    from book.errors import ReaderError

    gone = jax.numpy.arange(8.0)
    gone.delete()
    keys = jax.random.split(jax.random.key(0), 8)
    assert shards.summarize(keys).shape == (8,)  # its layout is there to summarize
    for call, words in [
        (lambda: display.shard_table(gone), "has been deleted"),
        (lambda: display.table(["x"], gone), "has been deleted"),
        (lambda: shards.summarize(gone), "has been deleted"),
        (lambda: display.shard_table(keys), "key_data"),
        (lambda: display.ring_diagram(np.broadcast_to(np.int64(8), (10**12,))), "at most"),
    ]:
        with pytest.raises(ReaderError, match=words) as caught:
            call()
        assert "\n" not in str(caught.value)


def test_analysis_modules_import_nothing_of_the_display():
    """Analysis returns data; only display and the forms above it render."""
    import ast

    from nbconventions import ROOT

    for name in ("errors", "validate", "specs", "hlo", "shards"):
        tree = ast.parse((ROOT / "book" / f"{name}.py").read_text())
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not {"display", "forms", "book.display", "book.forms"} & imported, name


@pytest.mark.parametrize(
    "values, dtype, reduce",
    [
        ([1.0, np.nan, 3.0, 4.0], jax.numpy.float32, "sum"),
        ([100, 100, 1, 2], jax.numpy.int8, "sum"),  # wraps round to -53
        ([256.0, 1.0, 1.0, 1.0], jax.numpy.bfloat16, "sum"),  # added wide, then rounded
        ([60000.0, 60000.0, 1.0, 2.0], jax.numpy.float16, "mean"),  # overflows
    ],
)
def test_a_collectives_own_result_is_drawn_whatever_its_type_does(values, dtype, reduce):
    mesh = jax.make_mesh((4,), ("i",), axis_types=(AxisType.Explicit,))
    x = jax.device_put(jax.numpy.array(values, dtype), NamedSharding(mesh, P("i")))
    op = jax.lax.psum if reduce == "sum" else jax.lax.pmean
    step = jax.shard_map(lambda v: op(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    y = jax.jit(step)(x)
    first = display.collective_diagram(x, y, reduce=reduce).text.splitlines()[0]
    held = display._inline_text(np.asarray(y.addressable_shards[0].data))
    assert first.endswith(f"= {held}"), (first, held)  # the total the devices hold


def test_a_sum_the_devices_do_not_hold_is_still_refused():
    mesh = jax.make_mesh((4,), ("i",), axis_types=(AxisType.Explicit,))
    x = jax.device_put(jax.numpy.arange(4.0), NamedSharding(mesh, P("i")))
    wrong = jax.device_put(jax.numpy.full(4, 7.0), NamedSharding(mesh, P("i")))
    with pytest.raises(display.DisplayError, match="neither the sum"):
        display.collective_diagram(x, wrong, reduce="sum")


@pytest.mark.parametrize(
    "size, article",
    [(8, "an"), (11, "an"), (18, "an"), (80, "an"), (110, "a"), (800, "an"), (1100, "a")]
    + [(11000, "an"), (18432, "an"), (11000000, "an"), (180, "a")],
)
def test_a_mesh_gets_the_article_its_size_is_said_with(size, article):
    assert display.mesh_text((size,)) == f"{article} {size}-device mesh"


def timeline_op(start=0.0, duration=1.0, name="f"):
    from book.trace import Op

    return Op(device=0, name=name, program="p", start=start, duration=duration)


@pytest.mark.parametrize("start, duration", [(10**400, 1.0), (0.0, -50.0)])
def test_a_timeline_of_times_no_bar_can_show_is_refused(start, duration):
    with pytest.raises(display.DisplayError, match="start and duration"):
        display.timeline([timeline_op(start, duration)], {})


def test_a_timeline_of_numpy_starts_places_bars_in_plain_arithmetic():
    ops = [timeline_op(np.int8(-128)), timeline_op(np.int8(127), name="g")]
    fig = display.timeline(ops, {}, title="cost $5 and $6 per step")
    bars = [path.vertices[:, 0].min() for c in fig.axes[0].collections for path in c.get_paths()]
    assert sorted(bars) == pytest.approx([0.0, 0.255])  # (127 - -128) microseconds
    assert fig.axes[0].get_title() == "cost $5 and $6 per step"


def test_a_timeline_op_named_by_a_text_that_cannot_be_hashed_is_drawn():
    class Name(str):
        def __hash__(self):
            raise RuntimeError("no hash")

    display.timeline([timeline_op(name=Name("x"))], {})


@pytest.mark.parametrize(
    "values, dtype, reduce",
    [([1, 2, 3, 4], jax.numpy.int32, "mean"), ([True, True, False, True], bool, "sum")],
)
def test_a_reduction_jax_gives_in_another_type_is_drawn(values, dtype, reduce):
    mesh = jax.make_mesh((4,), ("i",), axis_types=(AxisType.Explicit,))
    x = jax.device_put(jax.numpy.array(values, dtype), NamedSharding(mesh, P("i")))
    op = jax.lax.psum if reduce == "sum" else jax.lax.pmean
    step = jax.shard_map(lambda v: op(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    display.collective_diagram(x, jax.jit(step)(x), reduce=reduce)  # 2.5, and 3


def test_a_timeline_of_more_devices_than_rows_is_refused():
    from book.trace import Op

    ops = [Op(device=d, name="f", program="p", start=0.0, duration=1.0) for d in range(300)]
    with pytest.raises(display.DisplayError, match="more rows than a timeline can show"):
        display.timeline(ops, {})


@pytest.mark.parametrize("rows", [[], [[]]])
def test_a_table_without_headers_is_refused(rows):
    with pytest.raises(ReaderError, match="no headers"):
        display.table([], rows)


def test_a_mesh_without_axes_is_refused_in_one_sentence():
    from jax.sharding import Mesh

    with pytest.raises(ReaderError, match="The mesh has no axes"):
        display.mesh_diagram(Mesh(np.array(jax.devices()[0]), ()))
