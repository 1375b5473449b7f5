"""Checkers for chapters 11 and 12: functions run in several processes, and performance counts."""

from __future__ import annotations

import contextlib

import numpy as np

from book import validate
from book.exercises.core import (
    Wrong,
    answered,
    checker,
    coarse,
    fresh_source,
    function,
    need,
    number,
    number_returned,
)
from book.exercises.core import shown as _shown

# Chapter 11: the reader's function runs in every process of a multi-process launch --------

_IN_WORKER = (
    "it runs alone in each worker process, where only jax, jnp, np, multihost_utils, "
    "NamedSharding, P, AxisType and book are defined; import anything else inside it"
)


def _function_text(fn, what):
    """The source of the reader's function, to be copied into each worker process, and its name.

    The source is ``None`` when the body is only a stub (a docstring, ``pass`` or
    ``return None``), so an unanswered exercise is explained without starting any process.
    """
    import ast
    import inspect
    import textwrap

    need(callable(fn), f"Not answered yet: pass a function, not {validate.describe(fn)}.")
    need(
        getattr(fn, "__name__", "") != "<lambda>",
        f"Write {what} with def, not lambda: the checker copies its source into each process.",
    )
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise Wrong(
            f"The checker cannot read the source of {what}; define it with def in a cell."
        ) from None
    tree = ast.parse(text)
    func = tree.body[0] if tree.body else None
    need(
        isinstance(func, ast.FunctionDef)
        and not func.decorator_list
        and func.name == getattr(fn, "__name__", None),
        f"Pass {what} itself, a plain function defined with def, and run its cell again.",
    )
    for stmt in func.body:
        docstring = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        empty = isinstance(stmt, ast.Return) and (
            stmt.value is None or getattr(stmt.value, "value", 0) is None
        )
        if not (docstring or empty or isinstance(stmt, ast.Pass)):
            return text, func.name
    return None, func.name


def _in_processes(text, name, what, exercise, args=()) -> list[dict]:
    """Run the reader's function through ``exercise`` in 2 processes of 4 CPU devices each.

    Each process runs ``book/exercises/host_worker.py`` and prints one ``RESULT <json>`` line;
    their dicts come back in process order. A process that raises, or a launch that hangs,
    becomes one sentence.
    """
    import json
    import tempfile
    from pathlib import Path

    import book.multihost
    from book.exercises import host_worker

    with tempfile.TemporaryDirectory(prefix="book-exercise-") as folder:
        answer = Path(folder) / "reader_answer.py"
        answer.write_text(f"{host_worker.READER_HEAD}\n\n{text}")
        worker = Path(host_worker.__file__)
        try:
            outputs = book.multihost.launch(
                worker, 2, 4, timeout=30, args=[exercise, answer, name, *args]
            )
        except book.multihost.WorkerError as err:
            raise Wrong(_worker_failure(err, what)) from None
    results = []
    for i, out in enumerate(outputs):
        found = [line[7:] for line in out.splitlines() if line.startswith("RESULT ")]
        need(found, f"Process {i} printed no result; let {what} return instead of exiting.")
        results.append(json.loads(found[-1]))
    return results


def _qualified(kind: type) -> str:
    """How ``WorkerError.raised`` names an exception type."""
    return f"{kind.__module__}.{kind.__qualname__}"


def _worker_failure(err, name) -> str:
    """One sentence for a failed launch, chosen by the error's fields, not its wording."""
    import book.data

    if err.timed_out:
        return (
            f"{name} still ran after 30 s in process {err.process}: one process probably "
            "waits in a collective that another never joins; every process must make the "
            "same JAX calls."
        )
    if err.raised == _qualified(book.data.ScatteredRows):
        return (
            "book.data.process_slice refuses this layout: each process's devices hold two "
            "separate blocks of rows, which one slice cannot name; let each device read its "
            "own piece, or read both blocks and pass them concatenated in order."
        )
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    last = lines[-1][:200] if lines else "an error"  # the log's last line, shown as it is
    if err.raised == _qualified(NameError):
        return f"In process {err.process}, {name} raised {last}: {_IN_WORKER}."
    return f"In process {err.process}, {name} raised {last}; fix that and check again."


@checker
def ch11_column_means(column_means):
    """Exercise 11.1: the mean of every column over all processes' rows, held by every process.

    Each of 2 processes gets its own fresh ``(8, 3)`` block of rows; the means must cover all
    16 rows and come back whole in both processes.
    """
    text, name = _function_text(column_means, "column_means")
    answered(text, "column_means returns nothing yet; return the 3 column means")
    results = _in_processes(text, name, "column_means", "column_means", args=[11])
    pieces = [np.asarray(r["local"]) for r in results]
    want = np.concatenate(pieces).mean(axis=0)
    for i, r in enumerate(results):
        need(not r["none"], "Not answered yet: column_means returns nothing in the workers.")
        need(
            "unreadable" not in r,
            f"Process {i} cannot read the result: it is a global array split over both "
            f"processes, {r.get('unreadable')}; return the means replicated, e.g. with "
            "out_shardings=NamedSharding(mesh, P()).",
        )
        need(
            "no_numbers" not in r,
            f"In process {i}, column_means returned {r.get('no_numbers')}; return the 3 column "
            "means, an array.",
        )
        got = np.asarray(r["out"])
        need(got.shape == want.shape, f"Process {i} returned shape {got.shape}, not (3,).")
        own = pieces[i].mean(axis=0)
        need(
            not (np.allclose(got, own) and not np.allclose(got, want)),
            f"Process {i} returned the means of its own 8 rows only; build one global array "
            "from both processes' rows and take the means of that.",
        )
        need(
            np.allclose(got, want, atol=1e-5),
            f"Process {i} returned {np.round(got, 4).tolist()}, but the means over all 16 rows "
            f"are {np.round(want, 4).tolist()}.",
        )
    return f"both processes hold the means of all 16 rows, {np.round(want, 4).tolist()}."


@checker
def ch11_own_rows(build):
    """Exercise 11.2: a global batch split ``P(('model', 'data'))``, each process reading its rows.

    On the 4x2 mesh over 2 processes, that spec gives each process two separate blocks of the
    batch, so the one-block recipe of the chapter does not apply. The check: the right values
    on every device, the given sharding, and each process read exactly the rows its own devices
    hold, each once.
    """
    import tempfile

    text, name = _function_text(build, "build")
    answered(text, "build returns nothing yet; return the batch as a jax.Array")
    with tempfile.TemporaryDirectory(prefix="book-exercise-") as folder:
        fresh_source(folder, 256, 4, seed=1101)
        results = _in_processes(text, name, "build", "own_rows", args=[folder, 7])
    for i, r in enumerate(results):
        need(r["type"] != "NoneType", "build returns nothing yet; return the batch.")
        need(
            "values_ok" in r,
            f"In process {i}, build returned a {r['type']}; return a jax.Array of the "
            "batch's global shape (64, 4).",
        )
        need(
            r["same_sharding"],
            f"The batch comes out as {r['spec']}; build it with the sharding you were given, "
            "P(('model', 'data')).",
        )
        need(
            r["shards_ok"] and r["values_ok"],
            f"Some devices of process {i} do not hold the rows of their index; let each "
            "device's piece come from the rows its index selects.",
        )
        asked, mine = r["asked"], set(r["mine"])
        others = [row for row in asked if row not in mine]
        need(
            not others,
            f"Process {i} read {len(asked)} rows, {len(set(others))} of them held only by "
            "the other process's devices; read just the rows of this process's devices.",
        )
        need(
            len(asked) == len(mine),
            f"Process {i} read {len(asked)} rows for the {len(mine)} its devices hold; read "
            "each of them once.",
        )
    return (
        "each process read only the 32 rows its devices hold, in two separate blocks, and the "
        "global batch has the right rows on every device."
    )


# Chapter 12 ------------------------------------------------------------------------------


INTENSITY_SHAPES = [(128, 128, 128), (8, 4096, 8), (256, 64, 1024)]


def matmul_intensity(m, k, n, itemsize=4) -> float:
    """FLOPs per byte of ``(m, k) @ (k, n)`` as XLA's CPU cost analysis counts them.

    ``tests/test_exercise_checkers.py`` checks the two agree; the checker uses the formula, so
    it answers the same on every backend (a GPU's count can include a library's scratch space).
    """
    m, k, n = (
        validate.whole(v, name, error=validate.BadValue) for v, name in zip((m, k, n), "mkn")
    )
    itemsize = validate.whole(itemsize, "itemsize", high=16, example=4, error=validate.BadValue)
    return 2 * m * k * n / (itemsize * (m * k + k * n + m * n))


@checker
def ch12_intensity(intensity):
    """Exercise 12.1: FLOPs per byte of an ``(m, k) @ (k, n)`` float32 product, as XLA counts."""
    function(intensity, "intensity", INTENSITY_SHAPES[0], "(m, k, n)")
    found = []
    for m, k, n in INTENSITY_SHAPES:
        real = matmul_intensity(m, k, n)
        given = intensity(m, k, n)
        got = number_returned(given, "intensity", "the FLOPs divided by the bytes")
        coarse(given, got, real, "intensity", 1e-6 * real)
        product = f"({m}, {k}) @ ({k}, {n})"
        wrong = {
            real / 2: "that is half XLA's count: a multiply-add is 2 FLOPs, as "
            "cost.matmul_flops counts it",
            2 * m * k * n / (4 * (m * k + k * n)): "the output's bytes are missing: the result "
            "is written to memory too",
            real * 4: "that counts numbers, not bytes: a float32 number is 4 bytes",
        }
        for value, why in wrong.items():
            need(not np.isclose(got, value, rtol=1e-6), f"For {product} {why}.")
        need(
            np.isclose(got, real, rtol=1e-6),
            f"For {product} XLA counts {real:.4g} FLOPs per byte, not {got:.4g}: both inputs "
            "are read once and the output written once.",
        )
        found.append(real)
    return (
        f"{found[0]:.3g} FLOPs per byte for the 128-cube but {found[1]:.2g} for the thin "
        "(8, 4096) @ (4096, 8): a matrix product is compute-bound only when all its "
        "dimensions are large."
    )


class _Clock:
    """A simulated ``time.perf_counter``: only the stand-in's work moves it.

    The timer is judged on this clock, so the verdict depends on what the timer does (when it
    reads the clock, which calls and waits fall between its readings, how it combines them) and
    never on how busy the machine is.
    """

    def __init__(self):
        self.now, self.reads = 1000.0, 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def ns(self) -> int:
        return int(self() * 1e9)


class _Pending:
    """A result whose work is done at ``ready_at``, as a jax.Array is once its work is done."""

    def __init__(self, clock: _Clock, ready_at: float):
        self._clock, self._ready_at = clock, ready_at

    def block_until_ready(self):
        self._clock.now = max(self._clock.now, self._ready_at)
        return self


class _StandIn:
    """A stand-in for a jitted function, with the three traps of timing one.

    The first call compiles before it returns; every call returns at once, after a short
    dispatch, and its work finishes later, queued behind earlier work; every fourth call's work is
    slowed by a busy neighbour.
    """

    WORK, DISPATCH = 0.02, 2e-5

    def __init__(self, clock: _Clock, compile_s: float = 0.3, slow_s: float = 0.15):
        self.clock, self.compile_s, self.slow_s = clock, compile_s, slow_s
        self.calls, self.timed_calls, self._busy_until = 0, 0, 0.0

    def __call__(self, *args):
        self.calls += 1
        self.timed_calls += self.clock.reads > 0
        if self.calls == 1:
            self.clock.now += self.compile_s
        self.clock.now += self.DISPATCH
        work = self.WORK + (self.slow_s if self.calls % 4 == 0 else 0.0)
        self._busy_until = max(self._busy_until, self.clock.now) + work
        return _Pending(self.clock, self._busy_until)


class _SimulatedModule:
    """A module whose clocks are the simulated one; every other attribute is the real module's."""

    def __init__(self, module, clocks):
        self._module, self._clocks = module, clocks

    def __getattr__(self, name):
        return self._clocks.get(name) or getattr(self._module, name)


@contextlib.contextmanager
def _simulated_time(clock: _Clock, timer):
    """``time.perf_counter`` and the other wall clocks read ``clock`` while the timer runs.

    Four ways a timer reaches a clock are covered: ``time.perf_counter()`` through the module
    (patched on the module), ``perf_counter()`` or ``time.monotonic()`` through names in the
    timer's own globals, such as a notebook's ``from time import perf_counter`` (rebound there,
    for the check only), and ``timeit``'s functions, whose clock is a default argument.
    """
    import time
    import timeit

    clocks = {name: clock for name in ("perf_counter", "monotonic", "time", "default_timer")}
    clocks.update({name: clock.ns for name in ("perf_counter_ns", "monotonic_ns", "time_ns")})
    real = {id(getattr(time, name)): sim for name, sim in clocks.items() if hasattr(time, name)}
    real[id(timeit.default_timer)] = clock
    modules = {
        id(time): _SimulatedModule(time, clocks),
        id(timeit): _SimulatedModule(timeit, clocks),
    }
    names = getattr(timer, "__globals__", {})
    swapped = {
        name: value for name, value in names.items() if id(value) in real or id(value) in modules
    }
    saved = time.perf_counter, time.perf_counter_ns, timeit.default_timer
    # timeit.Timer, timeit.timeit and timeit.repeat took the clock as a default argument.
    takers = (timeit.Timer.__init__, timeit.timeit, timeit.repeat)
    defaults = [f.__defaults__ for f in takers]
    for f, given in zip(takers, defaults, strict=True):
        f.__defaults__ = tuple(clock if d is saved[2] else d for d in given or ())
    time.perf_counter = timeit.default_timer = clock
    time.perf_counter_ns = clock.ns
    for name, value in swapped.items():
        names[name] = real.get(id(value)) or modules[id(value)]
    try:
        yield
    finally:
        names.update(swapped)
        time.perf_counter, time.perf_counter_ns, timeit.default_timer = saved
        for f, given in zip(takers, defaults, strict=True):
            f.__defaults__ = given


def _on_simulated_clock(timer, **stand_in):
    """What ``timer`` says of a fresh stand-in timed on a fresh simulated clock; the stand-in."""
    clock = _Clock()
    f = _StandIn(clock, **stand_in)
    with _simulated_time(clock, timer):
        result = timer(f, np.zeros(4, np.float32))
    need(result is None or f.calls > 0, "seconds_per_call never calls f; time calls of f(*args).")
    raw = result
    result = number_returned(result, "seconds_per_call", "a number of seconds")
    per_call = _StandIn.WORK + _StandIn.DISPATCH
    coarse(raw, result, per_call, "seconds_per_call's answer", tolerance=1e-6 * per_call)
    need(
        clock.reads > 0,
        "seconds_per_call reads no clock the checker can follow; time each call with "
        "time.perf_counter().",
    )
    return result, f


@checker
def ch12_timer(seconds_per_call):
    """Exercise 12.2: a timer that warms up, waits for each result and takes the median.

    The timer runs on a simulated clock (``_Clock``) against a stand-in that compiles on its first
    call, returns before its work is done and is slowed now and then. It is judged by what it
    does, never by wall-clock times: whether what it says moves when the work does (it waits for
    results inside the clock), when the compile does, and when the slow runs do (it takes a
    median), whether it makes an untimed call first, and whether it times several calls.
    """
    from book.timing import format_seconds

    function(seconds_per_call, "seconds_per_call", (_StandIn, np.zeros(4)), "(f, *args)")
    work = _StandIn.WORK
    per_call = work + _StandIn.DISPATCH  # from the call until its result is ready
    said, f = _on_simulated_clock(seconds_per_call)
    shown = format_seconds(said) if said > 0 else f"{said:g} s"
    need(
        said > 0.5 * work,
        f"Your timer says {shown} for {format_seconds(work)} of work: it timed the queueing; "
        "wait with jax.block_until_ready inside the clock.",
    )
    with_slower_compile, _ = _on_simulated_clock(seconds_per_call, compile_s=3.0)
    need(
        with_slower_compile == said,
        "Your timer's answer grows with the first call's compile; make one or two untimed "
        "calls first.",
    )
    need(
        f.calls > f.timed_calls,
        "Your timer makes no untimed call, so the first call, which compiles, is timed; make "
        "one or two first.",
    )
    need(
        f.timed_calls >= 3,
        f"Your timer times {f.timed_calls} call(s) of f; time several (five or more) and take "
        "their median.",
    )
    without_neighbour, _ = _on_simulated_clock(seconds_per_call, slow_s=0.0)
    need(
        without_neighbour == said,
        "Your timer's answer grows with a neighbour's slow runs; take the median of several "
        "runs, not the mean.",
    )
    need(
        np.isclose(said, per_call, rtol=1e-6),
        f"Your timer says {format_seconds(said)}, but a call takes {format_seconds(per_call)} "
        "until its result is ready; return seconds per call.",
    )
    return (
        f"{format_seconds(said)} per call for {format_seconds(work)} of work: it waits for each "
        "result and leaves out the compile and the slow runs."
    )


@checker
def ch12_dp_tp_bytes(sent_per_device):
    """Exercise 12.3: bytes each device sends in a DP x TP step on 2x4 with a batch of 512."""
    from book import cost, models, strategies
    from book.lessons.data_parallel import sizes as chapter_sizes

    answered(sent_per_device, "set sent_per_device to a number of bytes")
    given = sent_per_device
    sent_per_device = number(sent_per_device, "sent_per_device", "a number of bytes")
    sizes = chapter_sizes._replace(batch=512)
    real = strategies.analyze("DP x TP", (2, 4), sizes).sent_bytes
    coarse(given, sent_per_device, real, "sent_per_device", 4.5)  # the loss's 4 bytes or not
    split = models.param_count(sizes) - sizes.classes  # all but b2, which TP keeps whole

    def shard(m):  # numbers of the parameters one device holds when TP splits over m
        return split // m + sizes.classes

    logits = 512 // 2 * 16 * 4
    wrong = {
        logits + shard(4) * 4 + 4: "those are the sizes of the two arrays all-reduced; on a "
        "ring of n devices each one sends 2(n-1)/n times an array's size",
        cost.all_reduce_bytes(512 // 4 * 16 * 4, 2)
        + cost.all_reduce_bytes(shard(2) * 4 + 4, 4): "the axes are the other way round: "
        "data (the first) has 2 devices and model 4",
        cost.all_reduce_bytes(512 * 16 * 4, 4)
        + cost.all_reduce_bytes(shard(4) * 4 + 4, 2): "each data group holds half the batch, "
        "so the logits all-reduced over model have 256 rows, not 512",
        cost.all_reduce_bytes(512 // 2 * 16 * 4, 4)
        + cost.all_reduce_bytes(models.param_count(sizes) * 4 + 4, 2): "TP has split the "
        "parameters, so each device all-reduces only its model shard of the gradients",
        real / 2: "that is half: a ring all-reduce sends 2(n-1)/n times an array, a "
        "reduce-scatter's (n-1)/n and an all-gather's (n-1)/n",
        real * 2: "that is twice: count the bytes a device sends, not those it also receives",
    }
    for value, why in wrong.items():
        need(abs(sent_per_device - value) > 4, f"Not {_shown(sent_per_device)} bytes: {why}.")
    need(
        abs(sent_per_device - real) <= 4,
        f"Not {_shown(sent_per_device)} bytes: count two all-reduces, the logits of your data "
        "group's rows over model and your model shard of the gradients (and the loss) over "
        "data.",
    )
    return (
        f"{real:,.0f} bytes per device, as the compiled step's collectives send on a ring "
        "(the 4-byte loss included or not)."
    )
