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
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["compute", "all-gather", "reduce-scatter"]
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
