"""Profiles read back as plain data, and drawn: a real trace of a sharded program, and made-up
traces for the cases a CPU run does not write (accelerator processes, broken files)."""

import gzip
import json

import jax
import matplotlib
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from book import display, hlo, trace

matplotlib.use("Agg")


def write_trace(folder, events, name="perfetto_trace.json.gz"):
    run = folder / "plugins" / "profile" / "2026_01_01_00_00_00"
    run.mkdir(parents=True, exist_ok=True)
    with gzip.open(run / name, "wt") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": events}, f)
    return run / name


def op(name, device, ts, dur, run="7", module="jit_f"):
    args = {"hlo_op": name, "hlo_module": module, "device_ordinal": str(device), "run_id": run}
    return {"ph": "X", "pid": 1, "tid": 10 + device, "ts": ts, "dur": dur, "name": name,
            "args": args}  # fmt: skip


def test_a_real_trace_has_every_collective_on_every_device(tmp_path):
    mesh = jax.make_mesh((8,), ("i",), axis_types=(AxisType.Explicit,))
    x = jax.device_put(np.arange(64.0, dtype=np.float32), NamedSharding(mesh, P("i")))
    gather_sum = jax.jit(
        jax.shard_map(
            lambda b: jax.lax.all_gather(b, "i", tiled=True) * jax.lax.psum(b.sum(), "i"),
            mesh=mesh,
            in_specs=P("i"),
            out_specs=P(),
            check_vma=False,
        )
    )
    compiled = gather_sum.lower(x).compile()
    compiled(x).block_until_ready()
    with jax.profiler.trace(tmp_path, create_perfetto_trace=True):
        for step in range(2):
            with jax.profiler.StepTraceAnnotation("step", step_num=step):
                compiled(x).block_until_ready()
    found = trace.read(tmp_path)
    assert [s.number for s in found.steps] == [0, 1]
    assert found.devices == list(range(8))
    (program,) = [p for p in found.programs if "gather_sum" in p or "lambda" in p]
    runs = found.runs(program)
    assert len(runs) == 2
    names = {row.name: row.op for row in hlo.collectives(compiled)}
    assert {"all-gather", "all-reduce"} <= set(names.values())
    for ops in runs:
        assert {o.run for o in ops} == {ops[0].run}
        for device in range(8):
            seen = {o.name for o in ops if o.device == device}
            assert set(names) <= seen
        assert all(found.steps[0].start <= o.start for o in ops)


def test_ops_steps_and_runs_from_a_written_trace(tmp_path):
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {
            "ph": "X",
            "pid": 1,
            "tid": 1,
            "ts": 0.0,
            "dur": 50.0,
            "name": "train",
            "args": {"step_num": "3"},
        },  # fmt: skip
        op("all-gather.1", 1, 5.0, 2.0),
        op("dot", 0, 1.0, 3.0),
        op("dot", 0, 30.0, 3.0, run="8"),
        {"ph": "X", "pid": 1, "tid": 1, "ts": 2.0, "dur": 1.0, "name": "python"},
    ]
    path = write_trace(tmp_path, events)
    assert trace.trace_file(tmp_path) == path
    found = trace.read(path)
    assert found.steps == (trace.Step("train", 3, 0.0, 50.0),)
    assert [(o.device, o.name, o.start) for o in found.ops] == [
        (0, "dot", 1.0),
        (1, "all-gather.1", 5.0),
        (0, "dot", 30.0),
    ]
    assert found.ops[1].end == 7.0 and found.programs == ["jit_f"]
    first, second = found.runs("jit_f")
    assert [o.run for o in first] == ["7", "7"] and [o.run for o in second] == ["8"]


def test_accelerator_processes_give_their_device_number(tmp_path):
    events = [
        {"ph": "M", "pid": 5, "name": "process_name", "args": {"name": "/device:TPU:3"}},
        {"ph": "M", "pid": 5, "tid": 2, "name": "thread_name", "args": {"name": "XLA Ops"}},
        {"ph": "M", "pid": 5, "tid": 9, "name": "thread_name", "args": {"name": "Steps"}},
        {"ph": "X", "pid": 5, "tid": 2, "ts": 1.0, "dur": 4.0, "name": "fusion.2"},
        {"ph": "X", "pid": 5, "tid": 9, "ts": 0.0, "dur": 9.0, "name": "0"},
    ]
    found = trace.read(write_trace(tmp_path, events))
    assert [(o.device, o.name) for o in found.ops] == [(3, "fusion.2")]


@pytest.mark.parametrize(
    "number, words", [("9" * 30, "has 30 digits"), ("9" * 5000, "has 5000 digits"), ("٣", "0 to 9")]
)
def test_a_device_process_numbered_past_any_device_is_refused(tmp_path, number, words):
    events = [
        {"ph": "M", "pid": 5, "name": "process_name", "args": {"name": f"/device:GPU:{number}"}},
        {
            "ph": "X",
            "pid": 5,
            "tid": 2,
            "ts": 1.0,
            "dur": 4.0,
            "name": "k",
            "args": {"hlo_op": "f"},
        },
    ]
    with pytest.raises(trace.TraceError, match="Event 1's device in its process's name") as caught:
        trace.read(write_trace(tmp_path, events))
    assert words in str(caught.value)


def test_runs_without_run_ids_are_cut_at_the_annotated_steps(tmp_path):
    step = {"ph": "X", "pid": 1, "tid": 1, "name": "train"}
    events = [
        {**step, "ts": 0.0, "dur": 10.0, "args": {"step_num": "0"}},
        {**step, "ts": 10.0, "dur": 10.0, "args": {"step_num": "1"}},
        {"ph": "M", "pid": 5, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 5, "tid": 2, "name": "thread_name", "args": {"name": "XLA Ops"}},
        {"ph": "X", "pid": 5, "tid": 2, "ts": 2.0, "dur": 1.0, "name": "fusion"},
        {"ph": "X", "pid": 5, "tid": 2, "ts": 12.0, "dur": 1.0, "name": "fusion"},
        {"ph": "X", "pid": 5, "tid": 2, "ts": 30.0, "dur": 1.0, "name": "after"},
    ]
    found = trace.read(write_trace(tmp_path, events))
    assert [[o.start for o in ops] for ops in found.runs("")] == [[2.0], [12.0]]


def test_runs_with_neither_run_ids_nor_steps_are_refused(tmp_path):
    events = [
        {"ph": "M", "pid": 5, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 5, "tid": 1, "ts": 0, "dur": 7, "name": "gemm",
         "args": {"hlo_op": "dot.1", "hlo_module": "jit_step"}},
        {"ph": "X", "pid": 5, "tid": 1, "ts": 9, "dur": 3, "name": "nccl",
         "args": {"hlo_op": "all-reduce.2", "hlo_module": "jit_step"}},
    ]  # fmt: skip
    found = trace.read(write_trace(tmp_path, events))
    assert found.programs == ["jit_step"]
    with pytest.raises(trace.TraceError, match="StepTraceAnnotation") as caught:
        found.runs("jit_step")
    assert "The 2 instructions of 'jit_step' carry no run id" in str(caught.value)


def test_the_plain_trace_is_read_where_no_perfetto_file_was_asked_for(tmp_path):
    path = write_trace(tmp_path, [op("dot", 0, 1.0, 1.0)], name="host.trace.json.gz")
    assert trace.trace_file(tmp_path) == path


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p, "holds no profile"),
        (lambda p: p / "missing.json.gz", "does not exist"),
        (lambda p: write_trace(p, []).parent.joinpath("x.trace.json.gz").write_text("no"), None),
    ],
)
def test_unreadable_traces_get_one_sentence(tmp_path, make, words):
    target = make(tmp_path)
    if words is None:  # a file that is not gzip
        target = tmp_path / "plugins" / "profile" / "2026_01_01_00_00_00" / "x.trace.json.gz"
        words = "is not a gzipped JSON trace"
    with pytest.raises(trace.TraceError) as caught:
        trace.read(target)
    assert words in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "given, words",
    [
        (None, "must be a path"),
        (5, "must be a path"),
        (b"/tmp", "must be a path"),
        (["a"], "must be a path"),
        ("", "must be a path"),
        ("a\0b", "NUL character"),
        ("x" * 5000, "cannot be read"),
    ],
)
def test_what_is_not_a_path_gets_one_sentence(given, words):
    for reader in (trace.read, trace.trace_file):
        with pytest.raises(trace.TraceError) as caught:
            reader(given)
        message = str(caught.value)
        assert words in message and "\n" not in message and len(message) < 300


def test_json_nested_too_deeply_gets_one_sentence(tmp_path):
    path = tmp_path / "deep.json.gz"
    with gzip.open(path, "wt") as f:
        f.write("[" * 100000)
    with pytest.raises(trace.TraceError, match="too deeply"):
        trace.read(path)


def step_event(step_num, **fields):
    return {"ph": "X", "pid": 1, "tid": 1, "ts": 0.0, "dur": 9.0, "name": "train",
            "args": {"step_num": step_num}, **fields}  # fmt: skip


def with_fields(event, **fields):
    return {**event, **fields}


def with_args(event, **args):
    return {**event, "args": {**event["args"], **args}}


@pytest.mark.parametrize(
    "event, words",
    [
        (with_fields(op("dot", 0, 1.0, 1.0), ts="abc"), "has ts 'abc'"),
        (with_fields(op("dot", 0, 1.0, 1.0), ts=None), "has ts None"),
        (with_fields(op("dot", 0, 1.0, 1.0), ts=[1]), "has ts [1]"),
        ({k: v for k, v in op("dot", 0, 1.0, 1.0).items() if k != "dur"}, "has no dur"),
        (with_fields(op("dot", 0, 1.0, 1.0), dur=-2.0), "has dur -2.0"),
        (with_args(op("dot", 0, 1.0, 1.0), device_ordinal="gpu0"), "device_ordinal must"),
        (with_args(op("dot", 0, 1.0, 1.0), device_ordinal=None), "device_ordinal must"),
        (with_args(op("dot", 0, 1.0, 1.0), device_ordinal=1.7), "not 1.7"),
        (with_args(op("dot", 0, 1.0, 1.0), device_ordinal=-1), "at least 0"),
        (with_args(op("dot", 0, 1.0, 1.0), device_ordinal="-1"), "at least 0"),
        (with_fields(op("dot", 0, 1.0, 1.0), args="hlo_op"), "has args 'hlo_op'"),
        (with_args(op("dot", 0, 1.0, 1.0), hlo_op=None), "has hlo_op None, where a trace has a"),
        (with_args(op("dot", 0, 1.0, 1.0), hlo_module={"a": 1}), "has hlo_module a dict"),
        (with_args(op("dot", 0, 1.0, 1.0), run_id=[1, 2]), "has run_id [1, 2]"),
        (with_fields(step_event(1), name=True), "has name True"),
        (with_fields(op("dot", 0, 1.0, 1.0), pid=[1]), "has pid [1]"),
        (step_event("one"), "step_num must"),
        (step_event(1.9), "not 1.9"),
        (step_event(None), "step_num must"),
        ({"ph": "M", "pid": 5, "name": "process_name", "args": [1]}, "has args [1]"),
        ({"ph": "M", "pid": 5, "name": "process_name", "args": None}, "has args None"),
        ({"ph": "M", "pid": 5, "tid": 2, "name": "thread_name", "args": {}}, "thread name"),
        ({"ph": "M", "pid": [5], "name": "process_name", "args": {"name": "x"}}, "pid [5]"),
    ],
)
def test_a_malformed_event_is_refused_naming_its_field(tmp_path, event, words):
    path = write_trace(tmp_path, [op("dot", 0, 1.0, 1.0), event])
    with pytest.raises(trace.TraceError) as caught:
        trace.read(path)
    message = str(caught.value)
    assert words in message and "Event 1" in message and "\n" not in message


@pytest.mark.parametrize("ts, dur", [("NaN", "1.0"), ("1.0", "Infinity"), ("1" + "0" * 400, "1")])
def test_times_that_are_no_finite_number_are_refused(tmp_path, ts, dur):
    path = tmp_path / "t.json.gz"
    event = '{"ph": "X", "ts": %s, "dur": %s, "args": {"hlo_op": "d", "device_ordinal": "0"}}'
    with gzip.open(path, "wt") as f:
        f.write('{"traceEvents": [%s]}' % (event % (ts, dur)))
    with pytest.raises(trace.TraceError, match="a finite number of microseconds"):
        trace.read(path)


def test_events_the_book_does_not_read_are_skipped(tmp_path):
    events = [
        op("dot", 0, 1.0, 1.0),
        {"ph": "X", "pid": 1, "tid": 1, "ts": "soon", "name": "python"},  # a host event
        {"ph": "i", "ts": None, "args": "x"},
        7,
    ]
    found = trace.read(write_trace(tmp_path, events))
    assert [(o.device, o.name, o.start) for o in found.ops] == [(0, "dot", 1.0)]


@pytest.mark.parametrize(
    "program, words", [(None, "None is not a program"), ("jit_g", "'jit_g' is not a program")]
)
def test_runs_of_a_program_the_trace_lacks_are_refused(tmp_path, program, words):
    found = trace.read(write_trace(tmp_path, [op("dot", 0, 1.0, 1.0)]))
    with pytest.raises(trace.TraceError) as caught:
        found.runs(program)
    assert words in str(caught.value) and "'jit_f'" in str(caught.value)
    with pytest.raises(trace.TraceError, match="holds no instructions"):
        trace.Trace((), ()).runs("jit_f")


def test_timeline_draws_one_row_per_device_coloured_by_kind():
    ops = [
        trace.Op(0, "all-gather.1", "jit_f", 0.0, 500.0),
        trace.Op(0, "dot", "jit_f", 500.0, 1500.0),
        trace.Op(1, "all-gather.1", "jit_f", 100.0, 400.0),
        trace.Op(1, "reduce-scatter.2", "jit_f", 600.0, 100.0),
    ]
    kinds = {"all-gather.1": "all-gather", "reduce-scatter.2": "reduce-scatter"}
    fig = display.timeline(ops, kinds, title="t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["device 0", "device 1"]
    (legend,) = fig.legends  # the figure's, in a strip below the axis's label
    assert [t.get_text() for t in legend.get_texts()] == ["compute", "all-gather", "reduce-scatter"]
    fig.canvas.draw()  # lays out the label where it will be drawn
    label = ax.xaxis.label.get_window_extent()
    assert legend.get_window_extent().y1 <= label.y0  # below the label, not over it
    colours = {tuple(np.round(c.get_facecolor()[0][:3], 3)) for c in ax.collections}
    want = {
        tuple(np.round(matplotlib.colors.to_rgb(display.TIMELINE_COLOURS[k]), 3))
        for k in ("compute", "all-gather", "reduce-scatter")
    }
    assert colours == want
    assert ax.get_xlim()[1] >= 2.0  # milliseconds: the dot ends 2 ms after the first op
    matplotlib.pyplot.close(fig)


def test_timeline_refuses_what_it_cannot_draw():
    with pytest.raises(display.DisplayError, match="nothing to draw"):
        display.timeline([], {})
    with pytest.raises(display.DisplayError, match="not a kind of collective"):
        display.timeline([trace.Op(0, "x", "p", 0.0, 1.0)], {"x": "broadcast"})


def test_a_trace_whose_compressed_stream_is_damaged_is_refused_in_one_sentence(tmp_path):
    import gzip

    good = gzip.compress(b'{"traceEvents": []}')
    path = tmp_path / "damaged.trace.json.gz"
    path.write_bytes(good[:10] + b"\xff" * 20 + good[30:])
    with pytest.raises(trace.TraceError, match="is not a gzipped JSON trace") as caught:
        trace.read(path)
    assert "\n" not in str(caught.value)
