"""What a profile recorded: the operations each device ran, read from ``jax.profiler``'s trace.

``jax.profiler.trace(log_dir, create_perfetto_trace=True)`` writes a folder
``log_dir/plugins/profile/<date_time>/`` holding the profile as an XSpace protocol buffer
(``<host>.xplane.pb``, what XProf and TensorBoard read), the same events as a Chrome trace
(``<host>.trace.json.gz``) and, as asked, ``perfetto_trace.json.gz``: that trace without its
metadata, for the Perfetto UI. JAX 0.10.0 and 0.12.0.1 both write all three. The JSON files
need nothing but ``gzip`` and ``json`` to read, so this module reads those.

A trace is a list of events in Chrome's Trace Event Format: complete events (``"ph": "X"``)
with a start ``ts`` and a duration ``dur`` in microseconds, on a process (``pid``) and a
thread (``tid``). XLA's CPU runtime marks each instruction of a compiled program it runs with
the arguments ``hlo_op`` (the instruction's name, as in ``compiled.as_text()``),
``hlo_module`` (the program), ``device_ordinal`` and ``run_id`` (one execution of the program,
the same on every device). ``jax.profiler.StepTraceAnnotation(name, step_num=n)`` adds an event
called ``name`` with the argument ``step_num``. The XProf trace viewer puts an accelerator's
own activity on a process per device (``/device:TPU:0``, ``/device:GPU:0``) with the
instructions on a thread called ``XLA Ops``; those are read as a fallback when an event has no
``device_ordinal``, a path the book has not run on real accelerators.

Everything here returns plain data; ``book.display.timeline`` draws it.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from book.errors import ReaderError

_DEVICE_PROCESS = re.compile(r"^/device:[A-Za-z_]+:(\d+)")
_OPS_THREAD = "XLA Ops"


class TraceError(ReaderError, ValueError):
    """A trace that cannot be read, explained in one sentence."""


@dataclass(frozen=True)
class Op:
    """One instruction of a compiled program, run once on one device.

    ``start`` and ``duration`` are in microseconds, ``start`` from the beginning of the trace.
    ``run`` tells executions of the program apart (the same on every device for one call).
    """

    device: int
    name: str
    program: str
    start: float
    duration: float
    run: str = ""

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(frozen=True)
class Step:
    """A span marked with ``jax.profiler.StepTraceAnnotation``: its name and step number."""

    name: str
    number: int
    start: float
    duration: float

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(frozen=True)
class Trace:
    """The instructions every device ran, in order of start, and the annotated steps."""

    ops: tuple[Op, ...]
    steps: tuple[Step, ...]

    @property
    def devices(self) -> list[int]:
        return sorted({op.device for op in self.ops})

    @property
    def programs(self) -> list[str]:
        return sorted({op.program for op in self.ops})

    def runs(self, program: str) -> list[tuple[Op, ...]]:
        """Each execution of ``program``, in the order they started: the ops of all devices.

        Executions are told apart by their run id; where the trace records none (as read from
        an accelerator's device processes), by the annotated step each op started in.
        """
        found: dict[object, list[Op]] = defaultdict(list)
        for op in self.ops:
            if op.program != program:
                continue
            key = op.run or next(
                (s.number for s in self.steps if s.start <= op.start < s.end), None
            )
            if key is not None:
                found[key].append(op)
        return sorted((tuple(ops) for ops in found.values()), key=lambda ops: ops[0].start)


def trace_file(log_dir) -> Path:
    """The trace ``jax.profiler.trace(log_dir, ...)`` wrote last under ``log_dir``.

    The newest run folder's ``perfetto_trace.json.gz``, or its ``*.trace.json.gz`` where the
    Perfetto file was not asked for.
    """
    root = Path(log_dir) / "plugins" / "profile"
    runs = sorted(root.glob("*/"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
    if not runs:
        raise TraceError(
            f"{log_dir} holds no profile: pass the folder given to jax.profiler.trace, after "
            "the trace has stopped."
        )
    newest = runs[-1]
    for pattern in ("perfetto_trace.json.gz", "*.trace.json.gz"):
        found = sorted(newest.glob(pattern))
        if found:
            return found[0]
    raise TraceError(f"{newest} holds no trace.json.gz: the profile was not exported as JSON.")


def _load(path: Path) -> list[dict]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, EOFError, ValueError) as err:
        raise TraceError(f"{path} is not a gzipped JSON trace ({err}).") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path} has no list of traceEvents: it is not a Chrome trace.")
    return [e for e in events if isinstance(e, dict)]


def _names(events, kind: str) -> dict:
    """The names metadata events give to processes (``kind`` "process_name") or threads."""
    key = (
        (lambda e: e.get("pid"))
        if kind == "process_name"
        else (lambda e: (e.get("pid"), e.get("tid")))
    )
    return {
        key(e): str(e.get("args", {}).get("name", ""))
        for e in events
        if e.get("ph") == "M" and e.get("name") == kind
    }


def _device(event, processes, threads) -> int | None:
    """The device an event ran on: its ``device_ordinal``, or its device process's number."""
    args = event.get("args") or {}
    if "hlo_op" in args and "device_ordinal" in args:
        return int(args["device_ordinal"])
    on_device = _DEVICE_PROCESS.match(processes.get(event.get("pid"), ""))
    thread = threads.get((event.get("pid"), event.get("tid")), "")
    if on_device and thread == _OPS_THREAD:
        return int(on_device.group(1))
    return None


def read(path) -> Trace:
    """The ops and steps of a trace file, or of the newest trace under a profile folder."""
    path = Path(path)
    if path.is_dir():
        path = trace_file(path)
    if not path.is_file():
        raise TraceError(f"{path} does not exist: pass a trace file or a profile folder.")
    events = _load(path)
    processes, threads = _names(events, "process_name"), _names(events, "thread_name")
    ops, steps = [], []
    for e in events:
        if e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        start, duration = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
        device = _device(e, processes, threads)
        if device is not None:
            name = str(args.get("hlo_op", e.get("name", "")))
            program = str(args.get("hlo_module", ""))
            ops.append(Op(device, name, program, start, duration, str(args.get("run_id", ""))))
        elif "step_num" in args:
            steps.append(Step(str(e.get("name", "")), int(args["step_num"]), start, duration))
    ops.sort(key=lambda op: (op.start, op.device))
    steps.sort(key=lambda s: s.start)
    return Trace(tuple(ops), tuple(steps))
