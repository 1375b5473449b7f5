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
called ``name`` with the argument ``step_num``. An accelerator's own activity is on a process
per device (``/device:GPU:0``, ``/device:TPU:0``). On an H100 with jax 0.11.2 (the book's
stored GPU measurement, benchmarks/gpu_trace.json.gz) each event there is one kernel, on a
thread per CUDA stream, named after the kernel and carrying ``hlo_module`` and ``hlo_op``
(the instruction that launched it, often a ``command_buffer``: XLA replays a run of kernels
as one CUDA graph) but no ``device_ordinal`` or ``run_id``: the device is read from the
process's name. The XProf viewer's thread of instructions, ``XLA Ops``, is read likewise.

Everything here returns plain data; ``book.display.timeline`` draws it.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from book import validate
from book.errors import ReaderError

_DEVICE_PROCESS = re.compile(r"^/device:[A-Za-z_]+:(\d+)")
_OPS_THREAD = "XLA Ops"
_MISSING = object()  # a field an event does not have
_TRACE_FILES = ("perfetto_trace.json.gz", "*.trace.json.gz")  # in the order they are preferred
MAX_TRACE_BYTES = 2**28  # unpacked: a profile of a few steps holds far less


class TraceError(ReaderError, ValueError):
    """A trace that cannot be read, explained in one sentence."""


@dataclass(frozen=True)
class Op:
    """One instruction of a compiled program, run once on one device.

    ``start`` and ``duration`` are in microseconds, ``start`` from the beginning of the trace.
    ``run`` tells executions of the program apart (the same on every device for one call).
    ``kernel`` is the event's own name where it differs from the instruction's: on a GPU, the
    kernel the instruction launched (a fusion's name, or a library's, such as cuBLAS's).
    """

    device: int
    name: str
    program: str
    start: float
    duration: float
    run: str = ""
    kernel: str = ""

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
        an accelerator's device processes), by the annotated step each op started in. A name
        the trace does not hold is refused rather than answered with no runs, so a misspelt
        program is not mistaken for one that never ran.
        """
        programs = self.programs
        if not isinstance(program, str) or program not in programs:
            listed = ", ".join(validate.describe(p, 60) for p in programs[:4])
            more = f" and {len(programs) - 4} more" if len(programs) > 4 else ""
            raise TraceError(
                f"{validate.describe(program)} is not a program of this trace; pass one of "
                f"its .programs: {listed}{more}."
                if programs
                else f"This trace holds no instructions, so it has no runs of "
                f"{validate.describe(program)}."
            )
        found: dict[object, list[Op]] = defaultdict(list)
        unplaced = 0
        for op in self.ops:
            if op.program != program:
                continue
            key = op.run or next(
                (s.number for s in self.steps if s.start <= op.start < s.end), None
            )
            if key is not None:
                found[key].append(op)
            else:
                unplaced += 1
        if unplaced and not found:
            raise TraceError(
                f"The {unplaced:,} instructions of {validate.describe(program)} carry no run id "
                "and lie in no annotated step, so its runs cannot be told apart; mark each step "
                "with jax.profiler.StepTraceAnnotation and trace again."
            )
        return sorted((tuple(ops) for ops in found.values()), key=lambda ops: ops[0].start)


@validate.impostors_refused
def trace_file(log_dir) -> Path:
    """The trace ``jax.profiler.trace(log_dir, ...)`` wrote last under ``log_dir``.

    The newest run folder's ``perfetto_trace.json.gz``, or its ``*.trace.json.gz`` where the
    Perfetto file was not asked for.
    """
    log_dir = validate.path(
        log_dir, "log_dir", "the folder given to jax.profiler.trace", error=TraceError
    )
    root = log_dir / "plugins" / "profile"
    try:
        runs = sorted(root.glob("*/"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
        newest = runs[-1] if runs else None
        found = [sorted(newest.glob(p)) for p in _TRACE_FILES] if newest else []
    except OSError as err:
        raise TraceError(f"{_shown(log_dir)} cannot be read ({err.strerror}).") from None
    if newest is None:
        raise TraceError(
            f"{_shown(log_dir)} holds no profile: pass the folder given to jax.profiler.trace, "
            "after the trace has stopped."
        )
    for files in found:
        if files:
            return files[0]
    raise TraceError(f"{newest} holds no trace.json.gz: the profile was not exported as JSON.")


def _shown(path: Path) -> str:
    """A path as a message quotes it, a long one cut short."""
    return validate.describe(str(path), 120)


def _load(path: Path) -> list:
    try:
        with gzip.open(path, "rb") as f:  # no more than the cap is unpacked
            raw = f.read(MAX_TRACE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as err:  # zlib: a damaged compressed stream
        raise TraceError(f"{path} is not a gzipped JSON trace ({err}).") from None
    if len(raw) > MAX_TRACE_BYTES:
        raise TraceError(
            f"{path} unpacks to more than {MAX_TRACE_BYTES >> 20} MiB of JSON; trace fewer "
            "steps (or a smaller program) and read that."
        )
    try:
        data = json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, ValueError) as err:
        raise TraceError(f"{path} is not a gzipped JSON trace ({err}).") from None
    except RecursionError:  # arrays nested thousands deep: no writer of traces makes them
        raise TraceError(f"{path} nests its JSON too deeply to be a trace.") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path} has no list of traceEvents: it is not a Chrome trace.")
    return events


def _bad(index: int, field: str, value, wanted: str) -> TraceError:
    had = f"no {field}" if value is _MISSING else f"{field} {validate.describe(value)}"
    return TraceError(
        f"Event {index} of the trace has {had}, where a trace has {wanted}; pass a trace "
        "jax.profiler wrote."
    )


def _args(index: int, event: dict) -> dict:
    """An event's ``args``: an object of arguments, or none."""
    args = event.get("args")
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise _bad(index, "args", args, "an object of named arguments")
    return args


def _ids(index: int, event: dict) -> None:
    """``pid`` and ``tid`` name a process and a thread: numbers or names, never lists."""
    for field in ("pid", "tid"):
        if isinstance(event.get(field), (list, dict)):
            raise _bad(index, field, event[field], "a number or a name")


def _names(events, kind: str) -> dict:
    """The names metadata events give to processes (``kind`` "process_name") or threads."""
    names = {}
    for index, e in enumerate(events):
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == kind:
            _ids(index, e)
            key = e.get("pid") if kind == "process_name" else (e.get("pid"), e.get("tid"))
            args = e.get("args")
            if not isinstance(args, dict) or not isinstance(args.get("name"), str):
                raise _bad(index, "args", args, f"the {kind.replace('_', ' ')} in args.name")
            names[key] = args["name"]
    return names


def _name(index: int, field: str, value) -> str:
    """A name an event carries (an instruction, a program, a run): text, or a run's number."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    raise _bad(index, field, value, "a name")


def _whole(index: int, field: str, value, high: int) -> int:
    """A device ordinal or step number: a whole number from 0, as a number or its digits."""
    name = f"Event {index}'s {field}"
    return validate.whole(value, name, low=0, high=high, text=True, example=0, error=TraceError)


def _time(index: int, event: dict, field: str) -> float:
    """``ts`` or ``dur`` in microseconds: a finite number, and a duration not negative."""
    value = event.get(field, _MISSING)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(index, field, value, "a number of microseconds")
    try:
        number = float(value)
    except OverflowError:  # a JSON integer too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise _bad(index, field, value, "a finite number of microseconds")
    if field == "dur" and number < 0:
        raise _bad(index, field, value, "a duration of at least 0 microseconds")
    return number


def _device(index, event, args, processes, threads) -> int | None:
    """The device an event ran on: its ``device_ordinal``, or its device process's number."""
    if "hlo_op" in args and "device_ordinal" in args:
        return _whole(index, "device_ordinal", args["device_ordinal"], validate.MAX_DEVICES - 1)
    on_device = _DEVICE_PROCESS.match(processes.get(event.get("pid"), ""))
    thread = threads.get((event.get("pid"), event.get("tid")), "")
    if on_device and ("hlo_op" in args or thread == _OPS_THREAD):
        number = on_device.group(1)
        return _whole(index, "device in its process's name", number, validate.MAX_DEVICES - 1)
    return None


@validate.impostors_refused
def read(path) -> Trace:
    """The ops and steps of a trace file, or of the newest trace under a profile folder.

    The events the book reads, the instructions a device ran and the annotated steps, must
    carry a finite ``ts`` and ``dur`` and whole ordinals and step numbers; one that does not is
    refused, naming its field, rather than read as a wrong time. Other events are skipped.
    """
    path = validate.path(path, "The trace", "a trace file or a profile folder", error=TraceError)
    try:
        if path.is_dir():
            path = trace_file(path)
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "does not exist"
            raise TraceError(f"{_shown(path)} {what}: pass a trace file or a profile folder.")
    except OSError as err:
        raise TraceError(f"{_shown(path)} cannot be read ({err.strerror}).") from None
    events = _load(path)
    processes, threads = _names(events, "process_name"), _names(events, "thread_name")
    ops, steps = [], []
    for index, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        _ids(index, e)
        args = _args(index, e)
        device = _device(index, e, args, processes, threads)
        if device is None and "step_num" not in args:
            continue
        start, duration = _time(index, e, "ts"), _time(index, e, "dur")
        if device is not None:
            own = _name(index, "name", e.get("name", ""))
            name = _name(index, "hlo_op", args.get("hlo_op", own))
            program = _name(index, "hlo_module", args.get("hlo_module", ""))
            run = _name(index, "run_id", args.get("run_id", ""))
            kernel = own if own != name else ""
            ops.append(Op(device, name, program, start, duration, run, kernel))
        else:
            number = _whole(index, "step_num", args["step_num"], validate.MAX_SIZE)
            steps.append(Step(_name(index, "name", e.get("name", "")), number, start, duration))
    ops.sort(key=lambda op: (op.start, op.device))
    steps.sort(key=lambda s: s.start)
    return Trace(tuple(ops), tuple(steps))
