"""Checkers for the exercises at the end of each chapter.

Each checker takes what the reader wrote (a function, a spec, a number), tries it on fresh inputs
and compares it with a reference the way a reviewer would: values, shardings and, where the
exercise is about communication, the compiled program. It answers with a ``Verdict``: one
friendly sentence saying what is right or what is wrong. It never raises, whatever the reader's
code does.
"""

from __future__ import annotations

import functools
import html
import traceback
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Verdict:
    """A checker's answer: whether the exercise is solved, and one sentence why."""

    ok: bool
    message: str

    def _repr_html_(self):
        colour, mark = ("#1e7b34", "✔") if self.ok else ("#a33", "✘")
        return (
            f"<div style='border-left:4px solid {colour};padding:4px 10px;margin:4px 0'>"
            f"<b style='color:{colour}'>{mark}</b> {html.escape(self.message)}</div>"
        )

    def __repr__(self):
        return ("Correct: " if self.ok else "Not yet: ") + self.message


class _Wrong(Exception):
    """Raised inside a checker to stop at the first problem with the reader's answer."""


def _checker(func):
    """Turn a checker that raises ``_Wrong`` into one that always returns a ``Verdict``."""

    @functools.wraps(func)
    def check(*args, **kwargs):
        try:
            return Verdict(True, func(*args, **kwargs))
        except _Wrong as wrong:
            return Verdict(False, str(wrong))
        except Exception as err:  # the reader's code failed: say where, briefly
            frame = traceback.extract_tb(err.__traceback__)[-1]
            return Verdict(
                False,
                f"Your code raised {type(err).__name__} ({str(err).splitlines()[0][:120]}) "
                f"at line {frame.lineno}; fix that and check again.",
            )

    return check


def _need(condition, message):
    if not condition:
        raise _Wrong(message)


def _answered(answer, what):
    _need(answer is not None and answer is not ..., f"Not answered yet: {what}.")


# Chapter 01 ------------------------------------------------------------------------------


def _linked(a, b) -> bool:
    return sum(abs(p - q) for p, q in zip(a, b)) <= 1


@_checker
def ch01_chip_rows(chip_rows):
    """Exercise 1.1: a 4x2 grid of the v3-8 cores, one chip per row, rows following the ring."""
    from book.devices import tpu_v3_8

    cores = tpu_v3_8()
    grid = chip_rows(list(cores))
    _answered(grid, "chip_rows returns nothing yet; return a 4x2 array of the cores")
    grid = np.asarray(grid, dtype=object)
    _need(grid.shape == (4, 2), f"The grid has shape {grid.shape}; it should be (4, 2).")
    ids = sorted(getattr(c, "id", -1) for c in grid.ravel())
    _need(ids == list(range(8)), "The grid should hold each of the eight cores exactly once.")
    for r, row in enumerate(grid):
        _need(
            row[0].coords == row[1].coords,
            f"Row {r} holds cores {row[0].id} and {row[1].id}, which sit on different chips.",
        )
    for r in range(4):
        a, b = grid[r, 0].coords, grid[(r + 1) % 4, 0].coords
        _need(
            _linked(a, b),
            f"Rows {r} and {(r + 1) % 4} hold chips {a[:2]} and {b[:2]}, which share no "
            "direct link, so the ring along 'data' takes a detour.",
        )
    return "each row is one chip, and consecutive rows (wrapping around) are linked chips."


@_checker
def ch01_reversed_mesh(reversed_mesh):
    """Exercise 1.2: a 2x2x2 Mesh over the devices in reverse id order, with explicit types."""
    import jax
    from jax.sharding import AxisType, Mesh

    devices = jax.devices()[:8]
    mesh = reversed_mesh(devices)
    _answered(mesh, "reversed_mesh returns nothing yet; return a jax.sharding.Mesh")
    _need(isinstance(mesh, Mesh), f"reversed_mesh returned a {type(mesh).__name__}, not a Mesh.")
    _need(
        tuple(mesh.axis_names) == ("pipe", "data", "model"),
        f"The axes are named {tuple(mesh.axis_names)}; use ('pipe', 'data', 'model').",
    )
    _need(mesh.devices.shape == (2, 2, 2), f"The mesh has shape {mesh.devices.shape}, not 2x2x2.")
    order = [d.id for d in mesh.devices.ravel()]
    want = [d.id for d in reversed(devices)]
    _need(order == want, f"Read in order, the mesh holds devices {order}; it should be {want}.")
    _need(
        all(t == AxisType.Explicit for t in mesh.axis_types),
        f"The axis types are {mesh.axis_types}; pass axis_types=(AxisType.Explicit,) * 3.",
    )
    return "a 2x2x2 mesh over the devices in reverse order, with explicit axis types."


# Chapter 02 ------------------------------------------------------------------------------


def _mesh_2x4():
    import jax
    from jax.sharding import AxisType

    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


@_checker
def ch02_predict(shard_shape, replication):
    """Exercise 2.1: shard shape and replication of (16, 8, 4) under P(None, ('model', 'data'))."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    _answered(shard_shape, "set shard_shape to a tuple such as (16, 8, 4)")
    _answered(replication, "set replication to a whole number")
    x = jax.device_put(
        np.zeros((16, 8, 4), np.float32), NamedSharding(_mesh_2x4(), P(None, ("model", "data")))
    )
    real_shape = x.sharding.shard_shape(x.shape)
    copies = len(x.sharding.device_set) // len({str(s.index) for s in x.addressable_shards})
    _need(
        tuple(shard_shape) == real_shape,
        f"The shard shape is not {tuple(shard_shape)}: dimension 1 is split over both mesh "
        "axes together, 4 x 2 = 8 ways.",
    )
    _need(
        replication == copies,
        f"Not {replication} copies: the spec uses every mesh axis, so each block lives on "
        f"{copies} device.",
    )
    return f"each device holds a {real_shape} block and nothing is replicated."


@_checker
def ch02_rows_on_device_1(rows):
    """Exercise 2.2: which rows of the 8x8 matrix device 1 holds under P(('model', 'data'))."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    _answered(rows, "set rows to the list of row numbers device 1 holds")
    x = jax.device_put(
        np.arange(64).reshape(8, 8), NamedSharding(_mesh_2x4(), P(("model", "data"), None))
    )
    device = jax.devices()[1]
    shard = next(s for s in x.addressable_shards if s.device == device)
    real = list(range(*shard.index[0].indices(8)[:2]))
    _need(
        sorted(rows) == real,
        f"Device 1 does not hold rows {sorted(rows)}: with 'model' as the major axis, rows are "
        "dealt out along 'model' first, then along 'data'.",
    )
    return f"device 1 (data=0, model=1) holds row {real[0]}."


@_checker
def ch02_spec_for_64_bytes(spec):
    """Exercise 2.3: a spec that stores exactly 64 bytes of an 8x8 int32 matrix per device."""
    import jax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    _answered(spec, "set spec to a PartitionSpec, such as P('pipe', None)")
    _need(isinstance(spec, PartitionSpec), f"spec is a {type(spec).__name__}, not a P(...).")
    mesh = jax.make_mesh((2, 2, 2), ("pipe", "data", "model"), axis_types=(AxisType.Explicit,) * 3)
    try:
        x = jax.device_put(np.arange(64, dtype=np.int32).reshape(8, 8), NamedSharding(mesh, spec))
    except Exception as err:  # JAX's own words for an impossible spec
        raise _Wrong(f"JAX cannot use {spec}: {str(err).splitlines()[0][:160]}") from None
    per_device = max(s.data.nbytes for s in x.addressable_shards)
    ways = 256 // per_device
    _need(
        per_device == 64,
        f"{spec} stores {per_device} bytes per device: it splits the matrix {ways} ways, and "
        "64 bytes needs 4.",
    )
    return f"{spec} splits the matrix 4 ways and keeps 2 copies of every block."


# Chapters 03 and 04: what the compiler makes of the reader's program -----------------------


def _ints(shape, seed):
    """Small integers as float32: every sum is exact, so a parallel result equals NumPy's."""
    return np.random.default_rng(seed).integers(-2, 3, size=shape).astype(np.float32)


def _first_sentence(err) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text.split(". ")[0].rstrip(".")[:160]


def _run(fn, *args):
    """The reader's result and compiled program; ``fn`` is jitted here if it is not already.

    A ``ShardingTypeError`` is the lesson of chapter 04, not a bug in the reader's code, so it
    gets its own sentence instead of the generic one.
    """
    import jax

    _need(callable(fn), f"Not answered yet: pass a function, not a {type(fn).__name__}.")
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    try:
        out = jitted(*args)
        if out is None:
            return None, None
        return out, jitted.lower(*args).compile()
    except Exception as err:
        if type(err).__name__ != "ShardingTypeError":
            raise
        raise _Wrong(
            f"JAX cannot decide a sharding in your function ({_first_sentence(err)}); "
            "settle it with out_sharding= or jax.reshard."
        ) from None


def _same(actual, expected) -> bool:
    return np.array_equal(np.asarray(actual), expected)


def _device_groups(row, mesh) -> list[list[int]]:
    """A collective's groups as device ids: its members are positions in the mesh's order."""
    at = list(mesh.devices.flat)
    return [[at[p].id for p in group] for group in row.groups]


def _spec_text(spec) -> str:
    return "P(" + ", ".join(repr(s) for s in spec) + ")"


def _padded(spec, ndim) -> tuple:
    return tuple(spec) + (None,) * (ndim - len(tuple(spec)))


@_checker
def ch03_no_communication(a_spec, b_spec):
    """Exercise 3.1: layouts on the 2x4 mesh whose product needs no communication at all.

    Three conditions together: no collective in the compiled product, each output block on one
    device only (no repeated work), and neither operand stored whole on a device (no replicated
    shortcut). They leave only one answer up to swapping the axes: A split by rows over one
    mesh axis, B by columns over the other.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    import book.hlo

    _answered(a_spec, "set a_spec to a PartitionSpec for A, such as P('data', None)")
    _answered(b_spec, "set b_spec to a PartitionSpec for B")
    for name, spec in (("a_spec", a_spec), ("b_spec", b_spec)):
        _need(isinstance(spec, PartitionSpec), f"{name} is a {type(spec).__name__}, not a P(...).")
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    A, B = _ints((32, 64), 31), _ints((64, 16), 32)
    placed = []
    for name, value, spec in (("A", A, a_spec), ("B", B, b_spec)):
        try:
            placed.append(jax.device_put(value, NamedSharding(mesh, spec)))
        except Exception as err:  # JAX's own words for an impossible spec
            raise _Wrong(f"JAX cannot place {name} with {spec}: {_first_sentence(err)}.") from None
    a, b = placed
    matmul = jax.jit(jnp.matmul)
    out = matmul(a, b)
    _need(_same(out, A @ B), "The product differs from NumPy's, which should not happen.")
    found = [r.op for r in book.hlo.collectives(matmul.lower(a, b).compile())]
    _need(
        "all-reduce" not in found,
        f"The compiled product sums partial products with an all-reduce: with {a_spec} and "
        f"{b_spec} the contraction dimension K is split, so keep K whole on both sides.",
    )
    _need(
        not found,
        f"The compiled product needs {' and '.join(found)}: the compiler must move an operand, "
        "because the two splits cannot be combined where they are.",
    )
    for name, x in (("A", a), ("B", b)):
        _need(
            x.sharding.shard_shape(x.shape) != x.shape,
            f"With {x.sharding.spec} every device stores the whole of {name}; split it over a "
            "mesh axis the other operand leaves free.",
        )
    copies = out.size // int(np.prod(out.sharding.shard_shape(out.shape)))
    _need(
        copies == 8,
        f"The output is split only {copies} ways, so {8 // copies} devices compute every block; "
        "use the other mesh axis for the other output dimension.",
    )
    return (
        f"the output comes out as {out.sharding.spec}, one block per device, and the compiled "
        "product has no collective at all."
    )


@_checker
def ch03_gram(gram):
    """Exercise 3.2: ``a.T @ a`` for ``a`` split by rows, left split by rows: no all-gather.

    Each device's rows of ``a`` give a partial ``aᵀa``; the cheap plan sums those partial
    products and keeps each device's rows of the sum (a reduce-scatter), while the expensive
    one all-gathers ``a``. On mock CPU devices the compiler writes the reduce-scatter as an
    all-reduce followed by a dynamic-slice of its result, so there the check asserts those two
    and quotes the slice; elsewhere it asserts the reduce-scatter.
    """
    import jax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    A = _ints((128, 16), 33)
    a = jax.device_put(A, NamedSharding(mesh, P("x", None)))
    out, compiled = _run(gram, a)
    _answered(out, "gram returns nothing yet; return a.T @ a")
    _need(
        getattr(out, "shape", None) == (16, 16) and _same(out, A.T @ A),
        "The result is not a.T @ a: check the order of the transpose and the product.",
    )
    spec = out.sharding.spec
    _need(
        not out.sharding.is_fully_replicated,
        "Every device ends up with the whole of a.T @ a; ask for it split by rows with "
        "out_shardings= (or a sharding constraint on the product).",
    )
    _need(
        not out.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "x")), 2),
        "The product is split by columns, P(None, 'x'); the values match because aᵀa is "
        "symmetric, but the exercise asks for rows, P('x', None).",
    )
    _need(
        out.sharding.is_equivalent_to(NamedSharding(mesh, P("x", None)), 2),
        f"The product comes out as {spec}; ask for P('x', None), each device keeping its rows.",
    )
    import book.hlo

    rows = book.hlo.collectives(compiled)
    gathered = [r for r in rows if r.op == "all-gather"]
    _need(
        not gathered,
        f"The compiled program all-gathers {list(gathered[0].shape if gathered else ())}: it "
        "moves a to every device instead of summing each device's partial product.",
    )
    ops = [r.op for r in rows]
    if jax.default_backend() != "cpu":
        _need(
            ops == ["reduce-scatter"],
            f"Expected one reduce-scatter of the partial products, but the program has "
            f"{ops or 'none'}.",
        )
        return (
            "each device keeps its rows of aᵀa, the partial products summed with a reduce-scatter."
        )
    _need(
        ops == ["all-reduce"],
        f"Expected one reduction of the partial products, but the program has {ops or 'none'}.",
    )
    (reduce,) = book.hlo.instructions(compiled, "all-reduce")
    cuts = [
        i
        for i in book.hlo.instructions(compiled, "dynamic-slice")
        if f"%{reduce.name}" in i.operands
    ]
    _need(
        bool(cuts),
        "The program sums the partial products but never cuts out each device's rows.",
    )
    cut = cuts[0]
    line = cut.text(width=10_000).splitlines()[0].removeprefix("ROOT ")
    what = f"`{line}`" + (f" (a fusion of {', '.join(cut.main_fused)})" if cut.fused else "")
    return (
        "each device keeps its rows of aᵀa: the partial products are summed with an all-reduce "
        f"and each device's rows cut out by {what}, the CPU compiler's way of writing a "
        "reduce-scatter."
    )


@_checker
def ch03_sum_groups(groups, out_spec):
    """Exercise 3.3: which devices add together in ``a.sum(axis=0)``, a split P('data', 'model').

    Summing over rows combines blocks that differ only in their ``data`` index, so the
    all-reduce runs within each column of the mesh, and the sums stay split over ``model``.
    """
    import jax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    import book.hlo

    _answered(groups, "set groups to a list of lists of device ids")
    _answered(out_spec, "set out_spec to a PartitionSpec")
    _need(isinstance(out_spec, PartitionSpec), f"out_spec is a {type(out_spec).__name__}, not a P.")
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    A = _ints((16, 32), 34)
    a = jax.device_put(A, NamedSharding(mesh, PartitionSpec("data", "model")))
    column_sums = jax.jit(lambda a: a.sum(axis=0))
    out = column_sums(a)
    (reduce,) = book.hlo.collectives(column_sums.lower(a).compile())
    real = {frozenset(g) for g in _device_groups(reduce, mesh)}
    try:
        yours = {frozenset(int(d) for d in g) for g in groups}
    except Exception:
        raise _Wrong(
            "groups should be a list of lists of device ids, e.g. [[0, 1], [2, 3]]."
        ) from None
    mesh_rows = {frozenset(d.id for d in row) for row in mesh.devices}
    _need(
        yours != mesh_rows,
        "Those are the rows of the mesh, devices with the same data index; summing a's rows "
        "adds blocks that differ in their data index.",
    )
    _need(
        yours == real,
        f"The all-reduce adds within {sorted(sorted(g) for g in real)}: one group per column of "
        "the mesh, the devices that hold the same columns of a.",
    )
    _need(
        NamedSharding(mesh, out_spec).is_equivalent_to(out.sharding, 1),
        f"The sums come out as {_spec_text(out.sharding.spec)}, not {_spec_text(out_spec)}: "
        "each group adds only its own columns, so the result stays split over 'model'.",
    )
    return "one all-reduce per column of the mesh, and the sums stay split over 'model'."


# Chapter 04 ------------------------------------------------------------------------------


def _explicit_2x4():
    import jax
    from jax.sharding import AxisType

    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


_CH04_CODE = {
    "transposed": "x.T",
    "concatenated": "jnp.concatenate([x, x], axis=1)",
    "sliced": "x[:, : d_in // 2]",
}


@_checker
def ch04_predict_types(transposed, concatenated, sliced, moves_data):
    """Exercise 4.1: the sharding in the type of three results, and which of them move data.

    The point is that the type does not tell the cost: a concatenation and a slice keep ``x``'s
    spec, but the blocks of the result are not the blocks each device holds.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import book.hlo

    answers = {"transposed": transposed, "concatenated": concatenated, "sliced": sliced}
    for name, answer in answers.items():
        _answered(answer, f"set {name} to a PartitionSpec")
        _need(isinstance(answer, P), f"{name} is a {type(answer).__name__}, not a P(...).")
    _answered(moves_data, "set moves_data to a set of names, such as {'sliced'}")
    if isinstance(moves_data, str):
        moves_data = {moves_data}
    moves_data = set(moves_data)
    unknown = moves_data - set(answers)
    _need(not unknown, f"moves_data names {sorted(unknown)}; use names from {sorted(answers)}.")
    cases = {
        "transposed": lambda x: x.T,
        "concatenated": lambda x: jnp.concatenate([x, x], axis=1),
        "sliced": lambda x: x[:, : x.shape[1] // 2],
    }
    moving = set()
    with jax.set_mesh(_explicit_2x4()):
        x = jax.device_put(_ints((16, 32), 41), P("data", "model"))
        for name, fn in cases.items():
            code = _CH04_CODE[name]
            jitted = jax.jit(fn)
            out = jitted(x)
            real = jax.typeof(out).sharding.spec
            _need(
                _padded(answers[name], out.ndim) == _padded(real, out.ndim),
                f"{code} has type {jax.typeof(out)}, so its spec is {_spec_text(real)}, not "
                f"{_spec_text(answers[name])}.",
            )
            if book.hlo.collectives(jitted.lower(x).compile()):
                moving.add(name)
    for name in sorted(moving - moves_data):
        _need(
            False,
            f"{_CH04_CODE[name]} moves data too: its type keeps a split over 'model', but "
            "the result's blocks are not the blocks of x each device holds.",
        )
    for name in sorted(moves_data - moving):
        _need(
            False,
            f"{_CH04_CODE[name]} moves nothing: every device makes its block of the result "
            "from its own block of x.",
        )
    return (
        "x.T is free, while the concatenation and the slice keep the spec of x in their type "
        "yet move data."
    )


@_checker
def ch04_mlp(mlp):
    """Exercise 4.2: chapter 03's perceptron on explicit axes, returned with the type of x.

    The one right plan sums the second product's partial products with a single all-reduce
    within each 'model' group; gathering the hidden activation or the second weight is
    rejected. An all-reduce is what every platform emits here (the result is whole along
    'model'), so the check reads the same on mock CPU devices as on accelerators.
    """
    import jax
    from jax.sharding import PartitionSpec as P

    import book.hlo

    mesh = _explicit_2x4()
    X, W1, W2 = _ints((16, 32), 42), _ints((32, 64), 43), _ints((64, 32), 44)
    with jax.set_mesh(mesh):
        x = jax.device_put(X, P("data", None))
        w1 = jax.device_put(W1, P(None, "model"))
        w2 = jax.device_put(W2, P("model", None))
        out, compiled = _run(mlp, x, w1, w2)
        _answered(out, "mlp returns nothing yet; return relu(x @ w1) @ w2")
        kind = jax.typeof(out)
    _need(
        getattr(out, "shape", None) == X.shape and _same(out, np.maximum(X @ W1, 0) @ W2),
        "The values differ from relu(x @ w1) @ w2 computed on one device.",
    )
    spec = _padded(kind.sharding.spec, 2)
    _need(
        spec != ("data", "model"),
        f"The result has type {kind}: still split over 'model', the reduce-scatter answer; "
        "the next layer wants the type of x, P('data', None).",
    )
    _need(spec == ("data", None), f"The result has type {kind}; it should be P('data', None).")
    rows = book.hlo.collectives(compiled)
    for r in rows:
        if r.op != "all-gather":
            continue
        what = {
            (8, 64): "the hidden activation, which should never leave its device",
            (64, 32): "w2, a whole copy of the weight on every device",
        }.get(r.shape, "an operand")
        raise _Wrong(
            f"The program all-gathers {what} ({list(r.shape)} per device); let the second "
            "product's partial sums be added instead."
        )
    model_groups = [[d.id for d in row] for row in mesh.devices]
    _need(
        [r.op for r in rows] == ["all-reduce"] and _device_groups(rows[0], mesh) == model_groups,
        f"Expected one all-reduce within each 'model' group {model_groups}, but the program has "
        f"{[(r.op, _device_groups(r, mesh)) for r in rows] or 'no collective'}.",
    )
    return (
        f"the result is {kind}, and the only communication is one all-reduce of "
        f"{rows[0].bytes:,} bytes per device within each 'model' group."
    )


@_checker
def ch04_small_operand(product):
    """Exercise 4.3: ``a @ v`` with a small ``a`` and a large ``v``, moving only ``a``.

    Any collective whose result is larger than the whole of ``a`` must carry (part of) ``v``,
    so that is the test. It holds on every platform: only what moves is checked, not which
    collectives the compiler picks to move it.
    """
    import jax
    from jax.sharding import PartitionSpec as P

    import book.hlo

    A, V = _ints((8, 32), 45), _ints((32, 256), 46)
    with jax.set_mesh(_explicit_2x4()):
        a = jax.device_put(A, P("data", None))
        v = jax.device_put(V, P(None, "data"))
        out, compiled = _run(product, a, v)
        _answered(out, "product returns nothing yet; return a @ v")
        kind = jax.typeof(out)
    _need(
        getattr(out, "shape", None) == (8, 256) and _same(out, A @ V),
        "The values differ from a @ v computed on one device.",
    )
    rows = book.hlo.collectives(compiled)
    big = max(rows, key=lambda r: r.bytes, default=None)
    _need(
        big is None or big.bytes <= A.nbytes,
        f"The program moves v: its {big.op if big else ''} delivers "
        f"{big.bytes if big else 0:,} bytes per device, more than all of a ({A.nbytes:,} "
        "bytes); move a instead.",
    )
    moved = ", ".join(f"{r.op} {list(r.shape)}" for r in rows)
    return f"only a-sized pieces move ({moved}), and the result has type {kind}."


# Chapters 07 to 09: training steps written with shard_map, checked against one device -----


def _line_mesh(axis):
    """The chapters' mesh: the 8 devices along one Explicit axis, equal to the reader's own."""
    import jax
    from jax.sharding import AxisType

    return jax.make_mesh((8,), (axis,), axis_types=(AxisType.Explicit,))


def _problem(seed, sizes):
    """Fresh parameters and batch; the biases are not zero, so a bias added twice shows."""
    from book import models

    params = models.init(seed, sizes.features, sizes.hidden, sizes.classes)
    rng = np.random.default_rng(seed)
    for name in ("b1", "b2"):
        params[name] = params[name] + rng.normal(0, 0.5, params[name].shape).astype(np.float32)
    x, y = models.synthetic_data(seed + 1, sizes.batch, sizes.features, sizes.classes)
    return params, np.asarray(x), np.asarray(y)


def _put(mesh, tree, specs):
    """``tree`` on ``mesh``, with one spec for every leaf or a dict of specs by name."""
    import jax
    from jax.sharding import NamedSharding

    if isinstance(specs, dict):
        return {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in tree.items()}
    return jax.device_put(tree, NamedSharding(mesh, specs))


def _one_device(fn, *args, argnums=0):
    """The single-device reference: ``fn``'s value and gradient at full float32 precision."""
    import jax

    with jax.default_matmul_precision("highest"):
        return jax.jit(jax.value_and_grad(fn, argnums=argnums))(*args)


def _compile_and_run(fn, *args):
    """The reader's function compiled for ``args``, and its result: ``(out, compiled)``.

    Two refusals of ``shard_map`` are lessons of these chapters, so each gets its own sentence
    instead of JAX's page-long message: ``in_specs`` that differ from how an input is placed
    (on Explicit axes they must agree), and ``check_vma`` refusing an ``out_specs`` of ``P()``
    for a value JAX cannot prove is the same on every device.
    """
    import re

    import jax

    _need(callable(fn), f"Not answered yet: pass a function, not a {type(fn).__name__}.")
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    try:
        with jax.default_matmul_precision("highest"):
            compiled = jitted.lower(*args).compile()
    except ValueError as err:
        text = str(err)
        mismatch = re.search(
            r"in_specs passed to shard_map: (P\([^)]*\)) does not match the specs of the "
            r"input: (P\([^)]*\))",
            text,
        )
        if mismatch:
            raise _Wrong(
                f"Your shard_map's in_specs say {mismatch.group(1)} for an input placed as "
                f"{mismatch.group(2)}; on Explicit mesh axes the in_specs must be the inputs' "
                "own specs."
            ) from None
        if "statically inferred" not in text:
            raise
        where = re.search(r"(out_specs\S*) is (P\([^)]*\))", text)
        what = f"{where.group(1)}, {where.group(2)}," if where else "out_specs"
        raise _Wrong(
            f"JAX refuses your shard_map: {what} promises a value that is the same on every "
            "device, but each device computes its own; combine them with psum or pmean first."
        ) from None
    return compiled(*args), compiled


def _row_shapes(row) -> list[tuple]:
    """The shapes a collective moves: several when the compiler combined collectives."""
    return list(row.shape) if row.shape and isinstance(row.shape[0], tuple) else [row.shape]


def _factor(got, want) -> float:
    """How many times ``want`` ``got`` is, read where ``want`` is not tiny."""
    got = np.asarray(got, np.float64).ravel()
    want = np.asarray(want, np.float64).ravel()
    big = np.abs(want) > 0.1 * np.abs(want).max()
    return float(np.median(got[big] / want[big])) if big.any() else float("nan")


def _near(got, want) -> bool:
    return np.allclose(np.asarray(got, np.float64), want, rtol=1e-4, atol=1e-5)


def _compare(label, got, want, factors=None, known=()):
    """``got`` against the one-device ``want``; a known mistake gets its own sentence.

    ``factors`` maps a wrong scale to its cause, ``known`` pairs the result of a plausible
    mistake with its cause.
    """
    got_shape = tuple(getattr(got, "shape", np.shape(got)))
    _need(
        got_shape == tuple(np.shape(want)),
        f"{label} has shape {got_shape}; it should be {tuple(np.shape(want))}, as on one device.",
    )
    if _near(got, want):
        return
    for value, why in known:
        _need(not _near(got, value), f"{label} differs from one device's: {why}.")
    factor = _factor(got, want)
    for value, why in (factors or {}).items():
        _need(
            not np.isclose(factor, value, rtol=1e-3),
            f"{label} is {value:g} times one device's: {why}.",
        )
    worst = float(np.max(np.abs(np.asarray(got, np.float64) - want)))
    raise _Wrong(f"{label} differs from one device's by up to {worst:.3g}.")


def _loss_and_grads(
    out, what, ref_loss, ref_grads, loss_factors=None, grad_factors=None, known_losses=()
):
    """The reader's ``(loss, grads)`` against the reference: the loss, then each gradient."""
    _answered(out, f"{what} returns nothing yet; return (loss, grads)")
    _need(
        isinstance(out, (tuple, list)) and len(out) == 2,
        f"{what} should return two things, (loss, grads).",
    )
    loss, grads = out
    _need(
        isinstance(grads, dict) and set(grads) == set(ref_grads),
        f"grads should be a dict with the keys {sorted(ref_grads)}, like params.",
    )
    _compare("The loss", loss, ref_loss, loss_factors, known_losses)
    for name, want in ref_grads.items():
        _compare(f"The gradient of {name}", grads[name], want, grad_factors)
    return loss, grads


def _sharded_as(arr, mesh, spec, label):
    from jax.sharding import NamedSharding

    sharding = getattr(arr, "sharding", None)
    _need(
        sharding is not None and sharding.is_equivalent_to(NamedSharding(mesh, spec), arr.ndim),
        f"{label} comes out as {_spec_text(getattr(sharding, 'spec', ()))}; return it as "
        f"{_spec_text(spec)}.",
    )


def _batch_stays(rows, weights=()):
    """No collective may gather anything but the whole weights: the batch stays split."""
    for r in rows:
        for shape in _row_shapes(r) if r.op == "all-gather" else ():
            _need(
                shape in weights,
                f"The program all-gathers an array of shape {shape}"
                + (", not a weight" if weights else "")
                + ": each device should keep its own examples; leave the batch split over "
                "'data'.",
            )


# Chapter 07 ------------------------------------------------------------------------------


def _example_losses(params, x, y):
    """The cross-entropy of each example, as the chapter's exercises define it."""
    import jax
    import jax.numpy as jnp

    from book import models

    log_probs = jax.nn.log_softmax(models.forward(params, x), axis=-1)
    return -jnp.take_along_axis(log_probs, y[:, None], axis=-1)[:, 0]


def _only_all_reduces(rows, most, what):
    ops = sorted({r.op for r in rows})
    sent = sum(r.bytes for r in rows)
    _need(ops == ["all-reduce"], f"Expected only all-reduces, but the program has {ops}.")
    _need(
        sent <= most,
        f"The program all-reduces {sent:,} bytes per device, more than the {what}; sum each "
        "of them once.",
    )
    return sent


@_checker
def ch07_sum_dp(sum_dp_grads):
    """Exercise 7.1: data parallelism when each device's loss is a sum over its examples.

    A fresh problem of 96 examples, 12 per device, so that the usual mistakes give different
    factors: a ``pmean`` of the sums (12, the examples per device), a ``psum`` not divided (96,
    the batch), a division by one device's examples or a double sum (8, the devices).
    """
    from jax.sharding import PartitionSpec as P

    import book.hlo
    from book import models

    mesh = _line_mesh("data")
    sizes = models.Sizes(batch=96, features=24, hidden=40, classes=8)
    params, x, y = _problem(701, sizes)
    ref_loss, ref_grads = _one_device(models.loss, params, x, y)
    args = _put(mesh, params, P()), _put(mesh, x, P("data")), _put(mesh, y, P("data"))
    out, compiled = _compile_and_run(sum_dp_grads, *args)
    _answered(out, "sum_dp_grads returns nothing yet; return (loss, grads)")
    rows = book.hlo.collectives(compiled)
    _batch_stays(rows)
    loss, grads = _loss_and_grads(
        out,
        "sum_dp_grads",
        ref_loss,
        ref_grads,
        loss_factors={
            12: "pmean divides the sum of all 96 losses by the 8 devices, not by the 96 "
            "examples; psum the sums and divide by the global batch",
            96: "the psum adds up the losses of all 96 examples; divide it by the global "
            "batch, x.shape[0] * jax.lax.axis_size('data')",
            8: "you divided by one device's 12 examples; divide by all 96",
            1 / 8: "pmean has already divided by the 8 devices, so divide by one device's 12 "
            "examples, or psum and divide by all 96",
        },
        grad_factors={
            12: "pmean divides the sum over all 96 examples by the 8 devices; psum the "
            "gradients and divide them by the global batch",
            96: "the psum adds up the gradients of all 96 examples; divide by the global batch",
            8: "the gradients were divided by one device's 12 examples, or added up over the "
            "devices twice (without pcast, JAX sums the gradients of replicated parameters "
            "itself, and a psum of those counts every device 8 times)",
            1 / 8: "pmean has already divided by the 8 devices, so divide by one device's 12 "
            "examples, or psum and divide by all 96",
        },
    )
    _sharded_as(loss, mesh, P(), "The loss")
    for name, g in grads.items():
        _sharded_as(g, mesh, P(), f"The gradient of {name}")
    param_bytes = sum(p.nbytes for p in params.values())
    sent = _only_all_reduces(rows, param_bytes + 8, f"{param_bytes:,} bytes of the gradients")
    return (
        "loss and gradients match one device's, and the only communication is all-reducing "
        f"the gradients and the loss, {sent:,} bytes per device."
    )


@_checker
def ch07_masked_mean(masked_dp_grads):
    """Exercise 7.2: the mean over the real examples when devices hold different numbers of them.

    The 8 devices hold 12, 3, 7, 12, 1, 9, 12 and 5 real examples of their 12 rows, so the mean
    of the devices' means is far from the mean over the examples.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import book.hlo
    from book import models

    mesh = _line_mesh("data")
    sizes = models.Sizes(batch=96, features=24, hidden=40, classes=8)
    params, x, y = _problem(702, sizes)
    real = np.array([12, 3, 7, 12, 1, 9, 12, 5])
    rng = np.random.default_rng(702)
    mask = np.zeros((8, 12), np.float32)
    for device, count in enumerate(real):
        mask[device, rng.choice(12, count, replace=False)] = 1
    mask = mask.ravel()

    def masked_loss(params, x, y, mask):
        return jnp.sum(_example_losses(params, x, y) * mask) / jnp.sum(mask)

    ref_loss, ref_grads = _one_device(masked_loss, params, x, y, mask)
    losses = np.asarray(jax.jit(_example_losses)(params, x, y), np.float64)
    sums = (losses * mask).reshape(8, 12).sum(axis=1)
    known = [
        (
            np.mean(sums / real),
            "that is the mean of the 8 devices' means, but they hold between 1 and 12 real "
            "examples, so their examples do not weigh the same; psum the masked sums and the "
            "counts, then divide",
        ),
        (
            sums.sum() / 96,
            "that divides by all 96 rows, padding included; divide by the number of real "
            "examples, the psum of the mask",
        ),
        (losses.mean(), "the padding counts as examples; multiply the losses by the mask"),
    ]
    args = (
        _put(mesh, params, P()),
        *(_put(mesh, a, P("data")) for a in (x, y, mask)),
    )
    out, compiled = _compile_and_run(masked_dp_grads, *args)
    _answered(out, "masked_dp_grads returns nothing yet; return (loss, grads)")
    rows = book.hlo.collectives(compiled)
    _batch_stays(rows)
    loss, grads = _loss_and_grads(
        out,
        "masked_dp_grads",
        ref_loss,
        ref_grads,
        grad_factors={
            8: "they were added up over the devices twice (without pcast, JAX sums the "
            "gradients of replicated parameters itself)",
        },
        known_losses=known,
    )
    _sharded_as(loss, mesh, P(), "The loss")
    for name, g in grads.items():
        _sharded_as(g, mesh, P(), f"The gradient of {name}")
    param_bytes = sum(p.nbytes for p in params.values())
    sent = _only_all_reduces(rows, param_bytes + 16, f"{param_bytes:,} bytes of the gradients")
    return (
        f"the mean over the {int(real.sum())} real examples, as on one device, with "
        f"{sent:,} bytes per device all-reduced: the gradients, the loss and the count."
    )


# Chapter 08 ------------------------------------------------------------------------------


def _fsdp_check(fn, what, specs, seed):
    """Run an FSDP exercise: fresh parameters placed with ``specs``, checked like chapter 08.

    Returns what the verdict reports: the bytes reduce-scattered and all-reduced per device.
    """
    from jax.sharding import PartitionSpec as P

    import book.hlo
    from book import models

    mesh = _line_mesh("data")
    sizes = models.Sizes(batch=96, features=24, hidden=40, classes=16)
    params, x, y = _problem(seed, sizes)
    ref_loss, ref_grads = _one_device(models.loss, params, x, y)
    args = _put(mesh, params, specs), _put(mesh, x, P("data")), _put(mesh, y, P("data"))
    try:
        out, compiled = _compile_and_run(fn, *args)
    except (TypeError, ValueError) as err:
        if not any(w in str(err) for w in ("dot_general", "Incompatible shapes", "broadcast")):
            raise
        raise _Wrong(
            f"The model got a parameter of the wrong shape ({_first_sentence(err)}); gather "
            "each sharded parameter along the dimension its spec splits, with tiled=True, "
            "and leave a replicated one as it is."
        ) from None
    _answered(out, f"{what} returns nothing yet; return (loss, grads)")
    rows = book.hlo.collectives(compiled)
    sharded = {k for k, s in specs.items() if s != P()}
    _batch_stays(rows, weights=[params[k].shape for k in sharded])
    summed = (
        "the gradients arrive summed over the 8 devices (the all-gather's transpose sums "
        "them, and JAX sums those of replicated parameters); divide them by "
        "jax.lax.axis_size('data')"
    )
    _, grads = _loss_and_grads(
        out,
        what,
        ref_loss,
        ref_grads,
        loss_factors={8: "psum adds up the 8 devices' mean losses; take their pmean"},
        grad_factors={8: summed},
    )
    for name, g in grads.items():
        _sharded_as(g, mesh, specs[name], f"The gradient of {name}")
    gathered = [s for r in rows if r.op == "all-gather" for s in _row_shapes(r)]
    for name in sorted(sharded):
        _need(
            params[name].shape in gathered,
            f"{name} is never gathered whole: FSDP gathers each weight where it is used, "
            "while the batch stays split.",
        )
    whole = sum(params[k].nbytes for k in params if k not in sharded)
    reduced = sum(r.bytes for r in rows if r.op == "all-reduce")
    _need(
        reduced <= whole + 8,
        f"The program all-reduces {reduced:,} bytes per device: whole gradients of sharded "
        "weights, summed everywhere and then cut to a shard; differentiate through the "
        "all_gather, and its transpose delivers each device only its shard.",
    )
    scattered = sum(r.bytes for r in rows if r.op == "reduce-scatter")
    shard_bytes = sum(params[k].nbytes for k in sharded) // 8
    _need(
        scattered == shard_bytes,
        f"The gradients of the sharded weights should come back by reduce-scatter, "
        f"{shard_bytes:,} bytes per device, but the program reduce-scatters {scattered:,}.",
    )
    return scattered, reduced


def _fsdp_specs(matrices, biases):
    from jax.sharding import PartitionSpec as P

    return {"w1": P(*matrices), "b1": P(*biases), "w2": P(*matrices), "b2": P(*biases)}


@_checker
def ch08_fsdp_columns(fsdp_by_columns):
    """Exercise 8.1: FSDP with every parameter split along its last dimension.

    The gathers must run along that dimension; the gradients must come back by reduce-scatter
    as column shards, and be divided by the 8 devices whose contributions they sum.
    """
    specs = _fsdp_specs((None, "data"), ("data",))
    scattered, _ = _fsdp_check(fsdp_by_columns, "fsdp_by_columns", specs, 801)
    return (
        "loss and gradients equal one device's; each parameter is gathered whole along its "
        "columns where the model uses it, and its gradient comes back as a column shard by "
        f"reduce-scatter, {scattered:,} bytes per device in all."
    )


@_checker
def ch08_replicated_biases(fsdp_dp_biases):
    """Exercise 8.2: FSDP for the weight matrices, data parallelism for the biases.

    The weights are gathered and their gradients reduce-scattered; the biases are never
    gathered, and their gradients (and the loss) are the only thing all-reduced.
    """
    specs = _fsdp_specs(("data", None), ())
    scattered, reduced = _fsdp_check(fsdp_dp_biases, "fsdp_dp_biases", specs, 802)
    return (
        f"the weights are gathered and their gradients reduce-scattered ({scattered:,} bytes "
        "per device), while the biases stay whole and only their gradients and the loss "
        f"are all-reduced ({reduced:,} bytes)."
    )


# Chapter 09 ------------------------------------------------------------------------------


@_checker
def ch09_two_layers(two_layers):
    """Exercise 9.1: two features-sharded layers, each a local matmul and a reduce-scatter.

    Small integers make every sum exact. The output must come out split by features like the
    input, and the only collectives are the two reduce-scatters, no all-reduce or all-gather.
    """
    from jax.sharding import PartitionSpec as P

    import book.hlo

    mesh = _line_mesh("model")
    X, W1, W2 = _ints((12, 48), 901), _ints((48, 64), 902), _ints((64, 24), 903)
    args = (
        _put(mesh, X, P(None, "model")),
        _put(mesh, W1, P("model", None)),
        _put(mesh, W2, P("model", None)),
    )
    out, compiled = _compile_and_run(two_layers, *args)
    _answered(out, "two_layers returns nothing yet; return relu(x @ w1) @ w2")
    want = np.maximum(X @ W1, 0) @ W2
    per_device = sum(np.maximum(X[:, k : k + 6] @ W1[k : k + 6], 0) for k in range(0, 48, 6))
    known = [
        (
            per_device @ W2,
            "the ReLU acts on each device's partial sums; apply it after the psum_scatter, "
            "to the complete hidden columns",
        ),
        (X @ W1 @ W2, "the ReLU between the layers is missing"),
    ]
    _compare("The output", out, want, known=known)
    _sharded_as(out, mesh, P(None, "model"), "The output")
    rows = book.hlo.collectives(compiled)
    for r in rows:
        _need(
            r.op != "all-reduce",
            f"The program all-reduces {list(r.shape)}: every device receives the whole sum "
            "and keeps an eighth of it; psum_scatter delivers each device only its slice.",
        )
        _need(
            r.op != "all-gather",
            f"The program all-gathers {list(r.shape)}; with features split, nothing needs "
            "gathering: each layer is a local matmul and a psum_scatter.",
        )
    shapes = sorted((r.op, r.shape) for r in rows)
    _need(
        shapes == [("reduce-scatter", (12, 3)), ("reduce-scatter", (12, 8))],
        f"Expected one reduce-scatter per layer, of shapes (12, 8) and (12, 3), but the "
        f"program has {shapes}.",
    )
    return (
        "two reduce-scatters, each device receiving its (12, 8) slice of the hidden "
        f"activation ({max(r.bytes for r in rows):,} bytes) and its (12, 3) slice of the "
        "output: the activation crosses devices at every layer, which the next exercise avoids."
    )


def _residual_block(params, x):
    import jax

    return x + jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


@_checker
def ch09_megatron_block(tp_block):
    """Exercise 9.2: a residual MLP block, column then row, with its gradients.

    Forward, the only collective is the all-reduce of the block's output; backward, the
    gradient of the replicated input is summed over the devices, one more all-reduce of the
    same shape. No collective may carry the hidden activation or gather a weight. The loss is
    nonlinear in the output, so the two all-reduces cannot be merged into one.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import book.hlo

    mesh = _line_mesh("model")
    B, D, H = 12, 16, 64
    rng = np.random.default_rng(902)
    params = {
        "w1": rng.standard_normal((D, H)) / np.sqrt(D),
        "b1": rng.normal(0, 0.5, H),
        "w2": rng.standard_normal((H, D)) / np.sqrt(H),
        "b2": rng.normal(0, 0.5, D),
    }
    params = {k: v.astype(np.float32) for k, v in params.items()}
    X = rng.standard_normal((B, D)).astype(np.float32)
    T = rng.standard_normal((B, D)).astype(np.float32)
    specs = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}
    args = _put(mesh, params, specs), _put(mesh, X, P())
    out, compiled = _compile_and_run(tp_block, *args)
    _answered(out, "tp_block returns nothing yet; return the block's output")
    p = {k: v.astype(np.float64) for k, v in params.items()}
    hidden = np.maximum(X @ p["w1"] + p["b1"], 0)
    want = X + hidden @ p["w2"] + p["b2"]
    known = [
        (want + 7 * p["b2"], "b2 is added on every device before the psum, so it counts 8 times"),
        (want + 7 * X, "x is added on every device before the psum, so it counts 8 times"),
        (X + hidden @ p["w2"] / 8 + p["b2"], "pmean averages the partial products; psum them"),
    ]
    _compare("The block's output", out, want, known=known)
    _sharded_as(out, mesh, P(), "The block's output")
    forward = book.hlo.collectives(compiled)

    def hidden_stays(rows):
        moved = [(r.op, shape) for r in rows for shape in _row_shapes(r)]
        for op, shape in moved:
            _need(
                shape not in ((B, H), (B, H // 8)),
                f"The program's {op} moves an array of shape {shape}: the hidden activation "
                "leaves its device; sum the partial products of the second layer instead.",
            )
        for op, shape in moved:
            _need(
                op != "all-gather",
                f"The program all-gathers {shape}, so every device holds a whole weight; "
                "keep w1 split by columns and w2 by rows, and sum the partial products.",
            )

    hidden_stays(forward)
    _need(
        [(r.op, r.shape) for r in forward] == [("all-reduce", (B, D))],
        f"Expected one all-reduce of the output's partial sums, {(B, D)}, but the program has "
        f"{[(r.op, r.shape) for r in forward]}.",
    )

    def loss(params, x):
        return jnp.mean(jnp.tanh(tp_block(params, x)) * T)

    def ref(params, x):
        return jnp.mean(jnp.tanh(_residual_block(params, x)) * T)

    _, (ref_params, ref_x) = _one_device(ref, params, X, argnums=(0, 1))
    (grad_params, grad_x), backward = _compile_and_run(jax.grad(loss, argnums=(0, 1)), *args)
    for name, got, want_grad in [("x", grad_x, ref_x)] + [
        (k, grad_params[k], ref_params[k]) for k in params
    ]:
        _need(
            _near(got, want_grad),
            f"The block's output is right but the gradient of {name} is not; let JAX "
            "differentiate through your shard_map with check_vma on, so that it sums the "
            "gradient of the replicated x over the devices.",
        )
    rows = book.hlo.collectives(backward)
    hidden_stays(rows)
    moved = [(r.op, s) for r in rows for s in _row_shapes(r)]
    _need(
        {op for op, _ in moved} <= {"all-reduce"},
        f"Expected only all-reduces in the training step, but it has {moved}.",
    )
    _need(
        len(moved) <= 2,
        f"The training step all-reduces {len(moved)} arrays where 2 are enough, the output "
        "forward and the gradient of x backward: with check_vma off, JAX cannot tell which "
        "values are the same on every device and sums to be safe; keep it on.",
    )
    _need(
        moved == [("all-reduce", (B, D))] * 2,
        f"Expected two all-reduces of shape {(B, D)} in the training step, but it has {moved}.",
    )
    return (
        f"the training step's only collectives are two all-reduces of shape {(B, D)}, the "
        f"block's output forward and the gradient of its input backward, {forward[0].bytes:,} "
        "bytes each per device; the hidden activation never leaves its device."
    )


# Chapter 10 ------------------------------------------------------------------------------


def _fresh_source(folder, num_examples, features, seed):
    """A small data set on disk, unlike the chapter's, whose every read is logged."""
    import book.data

    values = np.random.default_rng(seed).integers(-9, 10, size=(num_examples, features))
    return book.data.write(folder, x=values.astype(np.float32))


@_checker
def ch10_read_once(build):
    """Exercise 10.1: a batch on the 4x2 mesh split over 'data' only, each piece read once.

    The two devices of a 'model' group hold the same rows, and ``make_array_from_callback``
    asks for every device's piece, so it reads each piece twice. The reader's ``build`` must
    read each of the 4 distinct pieces once, put it on both devices that hold it, and never
    read more than one piece at a time. Every shard is compared with the file's rows.
    """
    import tempfile

    import jax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import book.data

    _need(callable(build), f"Not answered yet: pass a function, not a {type(build).__name__}.")
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    sharding = NamedSharding(mesh, P("data"))
    with tempfile.TemporaryDirectory(prefix="book-exercise-") as folder:
        source = _fresh_source(folder, 96, 5, seed=1001)
        rows = book.data.epoch_order(96, seed=5, epoch=2)[:32]
        batch = book.data.Batch(source, "x", rows)
        want = np.asarray(source.fields["x"][rows])
        source.reads.clear()
        out = build(batch, sharding)
        reads = list(source.reads)
    _answered(out, "build returns nothing yet; return the batch as a jax.Array")
    _need(isinstance(out, jax.Array), f"build returned a {type(out).__name__}, not a jax.Array.")
    _need(out.shape == want.shape, f"The batch has shape {out.shape}; it should be {want.shape}.")
    _need(
        out.sharding.is_equivalent_to(sharding, out.ndim),
        f"The batch comes out as {out.sharding.spec} on its mesh; build it with the sharding "
        "you were given, P('data') on the 4x2 mesh.",
    )
    for shard in out.addressable_shards:
        _need(
            np.array_equal(np.asarray(shard.data), want[shard.index]),
            f"Device {shard.device.id} does not hold rows {shard.index[0].start}:"
            f"{shard.index[0].stop} of the batch, which its index asks for; put each piece on "
            "the devices whose index it was read for.",
        )
    _need(reads, "Nothing was read through batch.read; read the pieces with it.")
    piece = want.shape[0] // 4
    _need(
        max(reads) <= piece,
        f"One read fetched {max(reads)} rows"
        + (", the whole batch" if max(reads) == want.shape[0] else "")
        + f"; read one piece of {piece} rows at a time, as the devices hold them.",
    )
    _need(
        len(reads) != 8,
        f"The batch took 8 reads of {piece} rows, but only 4 pieces differ: the 2 devices of "
        "each 'model' group hold the same rows, so each piece was read twice; read it once and "
        "put it on both devices.",
    )
    _need(
        sorted(reads) == [piece] * 4,
        f"The batch took {len(reads)} reads of {reads} rows; 4 reads of {piece} rows, one per "
        "distinct piece, are enough.",
    )
    return (
        f"4 reads of {piece} rows, each piece placed on both devices of its 'model' group, and "
        "every shard holds the right rows."
    )


@_checker
def ch10_padded_epoch(padded_epoch):
    """Exercise 10.2: every batch full size, the last one padded, the padding masked out.

    Checked on batch sizes that leave a remainder and on one that does not: every example
    exactly once among the unmasked rows, padding only in the last batch, and the order a
    deterministic, shuffled function of ``(seed, epoch)`` that every process can compute.
    """
    _need(
        callable(padded_epoch),
        f"Not answered yet: pass a function, not a {type(padded_epoch).__name__}.",
    )

    def plan(n, b, seed, epoch):
        got = padded_epoch(n, b, seed, epoch)
        _answered(got, "padded_epoch returns nothing yet; return (rows, mask)")
        _need(
            isinstance(got, tuple) and len(got) == 2,
            "padded_epoch should return two arrays, (rows, mask).",
        )
        rows, mask = np.asarray(got[0]), np.asarray(got[1])
        steps = -(-n // b)
        _need(
            rows.ndim != 2 or rows.shape[0] >= steps,
            f"With {n} examples in batches of {b} an epoch has {steps} batches, not "
            f"{rows.shape[0]}: {n - rows.shape[0] * b} examples are never seen; pad the last "
            "batch instead of dropping it.",
        )
        _need(
            rows.shape == (steps, b),
            f"rows has shape {rows.shape}; it should be ({steps}, {b}), every batch {b} rows, "
            "so that each one splits over the devices and the step compiles once.",
        )
        _need(mask.shape == rows.shape, f"mask has shape {mask.shape}; give it that of rows.")
        _need(
            np.issubdtype(rows.dtype, np.integer) and 0 <= rows.min() and rows.max() < n,
            f"Every entry of rows, padding included, should be an example number from 0 to "
            f"{n - 1}, so that the loader can read it.",
        )
        _need(
            mask.dtype == bool or set(np.unique(mask).tolist()) <= {0, 1},
            "mask should hold True for real examples and False for padding.",
        )
        return rows, mask.astype(bool)

    for n, b in ((1000, 64), (70, 8), (512, 64)):
        orders = {}
        for seed, epoch in ((3, 0), (3, 1), (4, 1)):
            rows, mask = plan(n, b, seed, epoch)
            ids = rows[mask]
            counts = np.bincount(ids, minlength=n)
            padding = rows.size - n
            if len(ids) == rows.size and padding:
                raise _Wrong(
                    f"With {n} examples in batches of {b}, {padding} rows are padding, but "
                    "mask keeps every row, so the padding trains as real examples; set mask "
                    "to False there."
                )
            _need(
                len(ids) == n and not (counts != 1).any(),
                f"The unmasked rows of epoch {epoch} ({n} examples, batches of {b}) miss "
                f"{(counts == 0).sum()} examples and repeat {(counts > 1).sum()}; each should "
                "appear exactly once.",
            )
            late = [k for k in range(len(mask) - 1) if not mask[k].all()]
            _need(
                not late,
                f"Batch {late[0] if late else 0} of {len(mask)} has masked rows; only the last "
                "batch should be padded, so that every other step trains on a full batch.",
            )
            again = plan(n, b, seed, epoch)
            _need(
                np.array_equal(again[0], rows) and np.array_equal(again[1], mask),
                f"Two calls for seed {seed}, epoch {epoch} gave different batches; every "
                "process must compute the same ones, so draw the order from (seed, epoch) only.",
            )
            _need(
                not np.array_equal(ids, np.sort(ids)),
                "The examples come in their stored order; shuffle them every epoch.",
            )
            orders[seed, epoch] = ids
        _need(
            not np.array_equal(orders[3, 0], orders[3, 1]),
            "Epochs 0 and 1 visit the examples in the same order; shuffle each epoch with its "
            "own order, e.g. book.data.epoch_order(num_examples, seed, epoch).",
        )
        _need(
            not np.array_equal(orders[3, 1], orders[4, 1]),
            "Seeds 3 and 4 give the same order; let the seed choose it.",
        )
    return (
        "every batch is full size, only the last one holds masked padding, and each epoch "
        "visits every example once in an order fixed by (seed, epoch)."
    )


# Chapter 11: the reader's function runs in every process of a multi-process launch --------

_WORKER_HEAD = """\
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import book.data

jax.distributed.initialize(
    num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
    process_id=int(os.environ["JAX_PROCESS_ID"]),
)
"""

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

    _need(callable(fn), f"Not answered yet: pass a function, not a {type(fn).__name__}.")
    _need(
        getattr(fn, "__name__", "") != "<lambda>",
        f"Write {what} with def, not lambda: the checker copies its source into each process.",
    )
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise _Wrong(
            f"The checker cannot read the source of {what}; define it with def in a cell."
        ) from None
    tree = ast.parse(text)
    func = tree.body[0] if tree.body else None
    _need(
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


def _in_processes(text, name, what, driver, args=()) -> list[dict]:
    """Run the reader's function through ``driver`` in 2 processes of 4 CPU devices each.

    The driver prints one ``RESULT <json>`` line per process; their dicts come back in process
    order. A process that raises, or a launch that hangs, becomes one sentence.
    """
    import json
    import tempfile
    from pathlib import Path

    import book.multihost

    script = f"{_WORKER_HEAD}\n\n{text}\n\n{driver.replace('READER', name)}"
    with tempfile.TemporaryDirectory(prefix="book-exercise-") as folder:
        path = Path(folder) / "exercise_worker.py"
        path.write_text(script)
        try:
            outputs = book.multihost.launch(path, 2, 4, timeout=30, args=args)
        except book.multihost.WorkerError as err:
            raise _Wrong(_worker_failure(err, what)) from None
    results = []
    for i, out in enumerate(outputs):
        found = [line[7:] for line in out.splitlines() if line.startswith("RESULT ")]
        _need(found, f"Process {i} printed no result; let {what} return instead of exiting.")
        results.append(json.loads(found[-1]))
    return results


def _worker_failure(err, name) -> str:
    text = str(err)
    if "still ran after" in text:
        return (
            f"{name} still ran after 30 s in process {err.process}: one process probably "
            "waits in a collective that another never joins; every process must make the "
            "same JAX calls."
        )
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1][:200] if lines else "an error"
    if "not next to each other" in last:
        return (
            "book.data.process_slice refuses this layout: each process's devices hold two "
            "separate blocks of rows, so there is no one block for "
            "make_array_from_process_local_data; let each device read its own piece instead."
        )
    if last.startswith("NameError"):
        return f"In process {err.process}, {name} raised {last}: {_IN_WORKER}."
    return f"In process {err.process}, {name} raised {last}; fix that and check again."


_MEANS_DRIVER = """\
seed = int(sys.argv[1])
me = jax.process_index()
local = np.random.default_rng([seed, me]).integers(-4, 5, size=(8, 3)).astype(np.float32)
mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
out = READER(local, mesh)
result = {"local": local.tolist(), "none": out is None}
try:
    result["out"] = None if out is None else np.asarray(out, dtype=np.float64).tolist()
except RuntimeError as err:  # a global array that spans the other process's devices
    result["unreadable"] = str(getattr(getattr(out, "sharding", None), "spec", "?"))
print("RESULT " + json.dumps(result))
jax.distributed.shutdown()
"""


@_checker
def ch11_column_means(column_means):
    """Exercise 11.1: the mean of every column over all processes' rows, held by every process.

    Each of 2 processes gets its own fresh ``(8, 3)`` block of rows; the means must cover all
    16 rows and come back whole in both processes.
    """
    text, name = _function_text(column_means, "column_means")
    _answered(text, "column_means returns nothing yet; return the 3 column means")
    results = _in_processes(text, name, "column_means", _MEANS_DRIVER, args=[11])
    pieces = [np.asarray(r["local"]) for r in results]
    want = np.concatenate(pieces).mean(axis=0)
    for i, r in enumerate(results):
        _need(not r["none"], "Not answered yet: column_means returns nothing in the workers.")
        _need(
            "unreadable" not in r,
            f"Process {i} cannot read the result: it is a global array split over both "
            f"processes, {r.get('unreadable')}; return the means replicated, e.g. with "
            "out_shardings=NamedSharding(mesh, P()).",
        )
        got = np.asarray(r["out"])
        _need(got.shape == want.shape, f"Process {i} returned shape {got.shape}, not (3,).")
        own = pieces[i].mean(axis=0)
        _need(
            not (np.allclose(got, own) and not np.allclose(got, want)),
            f"Process {i} returned the means of its own 8 rows only; build one global array "
            "from both processes' rows and take the means of that.",
        )
        _need(
            np.allclose(got, want, atol=1e-5),
            f"Process {i} returned {np.round(got, 4).tolist()}, but the means over all 16 rows "
            f"are {np.round(want, 4).tolist()}.",
        )
    return f"both processes hold the means of all 16 rows, {np.round(want, 4).tolist()}."


_ROWS_DRIVER = """\
folder, seed = sys.argv[1], int(sys.argv[2])
source = book.data.Source(folder)
asked = []
_read = source.read


def logged(field, rows):
    asked.extend(np.asarray(rows).ravel().tolist())
    return _read(field, rows)


source.read = logged
mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
sharding = NamedSharding(mesh, P(("model", "data")))
rows = book.data.epoch_order(source.num_examples, seed, 1)[:64]
batch = book.data.Batch(source, "x", rows)
out = READER(batch, sharding)
want = np.asarray(source.fields["x"])[rows]
held = sharding.addressable_devices_indices_map(batch.shape).values()
result = {
    "asked": asked,
    "mine": sorted(int(r) for index in held for r in rows[index[0]]),
    "type": type(out).__name__,
}
if isinstance(out, jax.Array) and out.shape == batch.shape:
    result["same_sharding"] = out.sharding.is_equivalent_to(sharding, out.ndim)
    result["spec"] = str(out.sharding.spec)
    result["shards_ok"] = all(
        np.array_equal(np.asarray(s.data), want[s.index]) for s in out.addressable_shards
    )
    gathered = multihost_utils.process_allgather(out, tiled=True)
    result["values_ok"] = bool(np.array_equal(gathered, want))
print("RESULT " + json.dumps(result))
jax.distributed.shutdown()
"""


@_checker
def ch11_own_rows(build):
    """Exercise 11.2: a global batch split ``P(('model', 'data'))``, each process reading its rows.

    On the 4x2 mesh over 2 processes, that spec gives each process two separate blocks of the
    batch, so the one-block recipe of the chapter does not apply. The check: the right values
    on every device, the given sharding, and each process read exactly the rows its own devices
    hold, each once.
    """
    import tempfile

    text, name = _function_text(build, "build")
    _answered(text, "build returns nothing yet; return the batch as a jax.Array")
    with tempfile.TemporaryDirectory(prefix="book-exercise-") as folder:
        _fresh_source(folder, 256, 4, seed=1101)
        results = _in_processes(text, name, "build", _ROWS_DRIVER, args=[folder, 7])
    for i, r in enumerate(results):
        _need(r["type"] != "NoneType", "build returns nothing yet; return the batch.")
        _need(
            "values_ok" in r,
            f"In process {i}, build returned a {r['type']}; return a jax.Array of the "
            "batch's global shape (64, 4).",
        )
        _need(
            r["same_sharding"],
            f"The batch comes out as {r['spec']}; build it with the sharding you were given, "
            "P(('model', 'data')).",
        )
        _need(
            r["shards_ok"] and r["values_ok"],
            f"Some devices of process {i} do not hold the rows of their index; let each "
            "device's piece come from the rows its index selects.",
        )
        asked, mine = r["asked"], set(r["mine"])
        others = [row for row in asked if row not in mine]
        _need(
            not others,
            f"Process {i} read {len(asked)} rows, {len(set(others))} of them held only by "
            "the other process's devices; read just the rows of this process's devices.",
        )
        _need(
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


def _matmul_intensity(m, k, n, itemsize=4) -> float:
    """FLOPs per byte of ``(m, k) @ (k, n)`` as XLA's CPU cost analysis counts them.

    ``tests/test_exercise_checkers.py`` checks the two agree; the checker uses the formula, so
    it answers the same on every backend (a GPU's count can include a library's scratch space).
    """
    return 2 * m * k * n / (itemsize * (m * k + k * n + m * n))


@_checker
def ch12_intensity(intensity):
    """Exercise 12.1: FLOPs per byte of an ``(m, k) @ (k, n)`` float32 product, as XLA counts."""
    _need(
        callable(intensity),
        f"Not answered yet: pass a function, not a {type(intensity).__name__}.",
    )
    found = []
    for m, k, n in INTENSITY_SHAPES:
        real = _matmul_intensity(m, k, n)
        got = intensity(m, k, n)
        _answered(got, "intensity returns nothing yet; return the FLOPs divided by the bytes")
        _need(
            isinstance(got, (int, float, np.number)),
            f"intensity returned a {type(got).__name__}; return a number.",
        )
        product = f"({m}, {k}) @ ({k}, {n})"
        wrong = {
            real / 2: "that is half XLA's count: a multiply-add is 2 FLOPs, as "
            "cost.matmul_flops counts it",
            2 * m * k * n / (4 * (m * k + k * n)): "the output's bytes are missing: the result "
            "is written to memory too",
            real * 4: "that counts numbers, not bytes: a float32 number is 4 bytes",
        }
        for value, why in wrong.items():
            _need(not np.isclose(got, value, rtol=1e-6), f"For {product} {why}.")
        _need(
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


class _Pending:
    """A result that is ready at a given moment, as a jax.Array is once its work is done."""

    def __init__(self, ready_at: float):
        self._ready_at = ready_at

    def block_until_ready(self):
        import time

        delay = self._ready_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        return self


class _StandIn:
    """A stand-in for a jitted function, with the three traps of timing one.

    The first call compiles; every call returns at once and its work finishes later, queued
    behind earlier work; every fourth call is slowed by a busy neighbour.
    """

    WORK = 0.02

    def __init__(self, compile_s: float = 0.3, slow_s: float = 0.15):
        self.compile_s, self.slow_s = compile_s, slow_s
        self.calls, self._busy_until = 0, 0.0

    def __call__(self, *args):
        import time

        self.calls += 1
        if self.calls == 1:
            time.sleep(self.compile_s)
        work = self.WORK + (self.slow_s if self.calls % 4 == 0 else 0.0)
        self._busy_until = max(self._busy_until, time.perf_counter()) + work
        return _Pending(self._busy_until)


def _seconds(timer, stand_in) -> float:
    result = timer(stand_in, np.zeros(4, np.float32))
    _answered(result, "seconds_per_call returns nothing yet; return a number of seconds")
    _need(stand_in.calls > 0, "seconds_per_call never calls f; time calls of f(*args).")
    _need(
        isinstance(result, (int, float, np.number)),
        f"seconds_per_call returned a {type(result).__name__}; return a number of seconds.",
    )
    return float(result)


@_checker
def ch12_timer(seconds_per_call):
    """Exercise 12.2: a timer that warms up, waits for each result and takes the median."""
    from book.timing import format_seconds

    _need(
        callable(seconds_per_call),
        f"Not answered yet: pass a function, not a {type(seconds_per_call).__name__}.",
    )
    work = _StandIn.WORK
    said = _seconds(seconds_per_call, _StandIn())
    _need(
        said > 0.5 * work,
        f"Your timer says {format_seconds(said)} per call, but each call's work takes "
        f"{format_seconds(work)}: it timed the queueing; wait for the result with "
        "jax.block_until_ready inside the clock.",
    )
    if said > 1.5 * work:
        no_neighbour = _seconds(seconds_per_call, _StandIn(slow_s=0.0))
        _need(
            no_neighbour <= 1.5 * work,
            f"Your timer says {format_seconds(said)} per call for {format_seconds(work)} of "
            "work: it includes the first call's compile; make one or two untimed calls first.",
        )
        raise _Wrong(
            f"Your timer says {format_seconds(said)} per call for {format_seconds(work)} of "
            "work: the slow runs pull it up; take the median of several runs, not the mean."
        )
    return (
        f"{format_seconds(said)} per call for {format_seconds(work)} of work: the compile, "
        "the queueing and the neighbour's slow runs are all left out."
    )


@_checker
def ch12_dp_tp_bytes(sent_per_device):
    """Exercise 12.3: bytes each device sends in a DP x TP step on 2x4 with a batch of 512."""
    from book import cost, models, strategies

    _answered(sent_per_device, "set sent_per_device to a number of bytes")
    _need(
        isinstance(sent_per_device, (int, float, np.number)),
        f"sent_per_device is a {type(sent_per_device).__name__}; give a number of bytes.",
    )
    sizes = models.Sizes(batch=512, features=64, hidden=256, classes=16)
    real = strategies.analyze("DP x TP", (2, 4), sizes).sent_bytes

    def shard(m):  # numbers of the parameters one device holds when TP splits over m
        return (64 * 256 + 256 + 256 * 16) // m + 16

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
    }
    for value, why in wrong.items():
        _need(abs(sent_per_device - value) > 4, f"Not {sent_per_device:,.0f} bytes: {why}.")
    _need(
        abs(sent_per_device - real) <= 4,
        f"Not {sent_per_device:,.0f} bytes: count two all-reduces, the logits of your data "
        "group's rows over model and your model shard of the gradients (and the loss) over "
        "data.",
    )
    return (
        f"{real:,.0f} bytes per device, as the compiled step's collectives send on a ring "
        "(the 4-byte loss included or not)."
    )


# Chapters 05 and 06: collectives written by hand, checked value by value and in the HLO ----


def _positions(out, mesh) -> list[np.ndarray]:
    """Each device's own block of ``out``, in the order of the mesh's positions."""
    held = {s.device: np.asarray(s.data) for s in out.addressable_shards}
    return [held[d] for d in mesh.devices.flat]


def _ring_pairs(n, step) -> set[tuple[int, int]]:
    return {(j, (j + step) % n) for j in range(n)}


def _blocks_added(block, blocks) -> np.ndarray | None:
    """How many times each of ``blocks`` was added to make ``block``, if it is such a sum."""
    basis = blocks.reshape(len(blocks), -1).T.astype(np.float64)
    target = np.asarray(block, np.float64).ravel()
    if basis.shape[0] != target.size:
        return None
    coef = np.linalg.lstsq(basis, target, rcond=None)[0]
    counts = np.rint(coef)
    return counts if np.array_equal(basis @ counts, target) else None


@_checker
def ch05_ring_sum(ring_sum):
    """Exercise 5.1: the sum of every device's block over 'i', from ppermute and additions.

    Fresh ``(4, 4)`` blocks of small integers make every sum exact, and each device's result
    can be read back as a count of each block in it: a missing step or a block added twice is
    named. Any schedule of ppermutes is accepted (a ring of 7 steps, or recursive doubling in
    3); an all-reduce or an all-gather is not.
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import book.hlo

    mesh = _line_mesh("i")
    n = mesh.size
    blocks = np.random.default_rng(501).integers(-9, 10, size=(n, 4, 4)).astype(np.float32)
    x = jax.device_put(blocks.reshape(n * 4, 4), NamedSharding(mesh, P("i")))
    out, compiled = _compile_and_run(ring_sum, x)
    _answered(out, "ring_sum returns nothing yet; return the sum of every device's block")
    rows = book.hlo.collectives(compiled)
    others = sorted({r.op for r in rows} - {"collective-permute"})
    _need(
        not others,
        f"The program has {_with_article(others)}: build the sum from ppermute and "
        "additions only, as the exercise asks.",
    )
    total = blocks.sum(axis=0)
    for p, block in enumerate(_positions(out, mesh)):
        _need(
            block.shape == total.shape,
            f"The device at position {p} holds a block of shape {block.shape}; the sum has "
            f"the shape of one block, {total.shape}.",
        )
        if np.array_equal(block, total):
            continue
        partial = [r for r in rows if len(r.groups) < n]
        _need(
            not partial,
            f"A ppermute sends along only {len(partial[0].groups) if partial else 0} pairs, "
            "so a device that nobody sends to receives zeros; close the ring with "
            f"({n - 1}, 0).",
        )
        counts = _blocks_added(block, blocks)
        _need(
            counts is not None,
            f"The device at position {p} holds something other than a sum of the blocks; "
            "add the blocks that arrive, unchanged.",
        )
        missing = [j for j in range(n) if counts[j] == 0]
        extra = [j for j in range(n) if counts[j] > 1]
        if extra:
            j, times = extra[0], int(counts[extra[0]])
            whose = "its own block" if j == p else f"the block of position {j}"
            often = "twice" if times == 2 else f"{times} times"
            raise _Wrong(
                f"The device at position {p} adds {whose} {often}; after n - 1 = {n - 1} "
                "steps every block has arrived once, so stop there."
            )
        _need(
            len(missing) < n - 1,
            f"The device at position {p} holds only its own block; pass blocks around the "
            "ring with ppermute and add each one that arrives.",
        )
        _need(
            not missing,
            f"The device at position {p} never adds the block{'s' * (len(missing) > 1)} of "
            f"position {', '.join(map(str, missing))}; it takes n - 1 = {n - 1} steps of the "
            f"ring for the {n - 1} other blocks to arrive.",
        )
        raise _Wrong(f"The device at position {p} does not hold the sum of the 8 blocks.")
    sent = sum(r.bytes for r in rows)
    return (
        f"every device holds the sum of all {n} blocks, built from {len(rows)} "
        f"collective-permutes ({sent:,} bytes sent per device) and additions, with no "
        "all-reduce."
    )


def _with_article(ops) -> str:
    return " and ".join(("an " if op[0] in "aeiou" else "a ") + op for op in ops)


def _chapter_05_rows(mesh) -> np.ndarray:
    """Chapter 05's ``rows_np``: row k belongs to position k, its values encode where it lives."""
    ids = np.array([d.id for d in mesh.devices.flat])
    return (100 + 10 * ids[:, None] + np.arange(len(ids))).astype(np.int32)


@_checker
def ch05_predict_all_to_all(shape, held_at_3):
    """Exercise 5.2: each device's result of an all_to_all that stacks along dimension 0.

    The answer is read against the real collective, run here on chapter 05's ``rows``.
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    _answered(shape, "set shape to a tuple, such as (2, 4)")
    _answered(held_at_3, "set held_at_3 to the values the device at position 3 holds")
    mesh = _line_mesh("i")
    rows_np = _chapter_05_rows(mesh)
    rows = jax.device_put(rows_np, NamedSharding(mesh, P("i")))

    def as_columns(block):
        return jax.lax.all_to_all(block, "i", split_axis=1, concat_axis=0, tiled=True)

    out = jax.shard_map(as_columns, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(rows)
    real = _positions(out, mesh)[3]
    try:
        yours = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise _Wrong("shape should be a tuple of whole numbers, such as (2, 4).") from None
    _need(
        yours != (1, 8),
        "(1, 8) is the shape with concat_axis=1, as in transpose_blocks; with concat_axis=0 "
        "the 8 parts a device receives are stacked along dimension 0.",
    )
    _need(
        yours == real.shape,
        f"Each device's result does not have shape {yours}: it receives 8 parts of shape "
        "(1, 1), one from each device, and joins them along concat_axis=0.",
    )
    try:
        values = np.asarray(held_at_3, dtype=np.int64).ravel()
    except (TypeError, ValueError):
        raise _Wrong("held_at_3 should be numbers, as a list or an array.") from None
    _need(
        not np.array_equal(values, rows_np[3]),
        "Those are the values position 3 starts with; after the all_to_all it keeps only "
        "part 3 of its row and receives part 3 of every other device's row.",
    )
    _need(
        np.array_equal(values, real.ravel()),
        f"Position 3 does not hold {values.tolist()}: it receives part 3 of every row, one "
        "value from each sender, in the order of the senders.",
    )
    return (
        f"each device holds a {real.shape} column, and position 3 holds column 3 of rows_np, "
        f"{real.ravel().tolist()}."
    )


@_checker
def ch05_from_five(from_five):
    """Exercise 5.3: every device gets the block of position 5, by one collective, as ``P()``.

    Moving it with ppermute, or all-gathering every block to keep one, is rejected; the value is
    checked on every device's own copy.
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import book.hlo

    mesh = _line_mesh("i")
    n = mesh.size
    blocks = np.random.default_rng(503).integers(-9, 10, size=(n, 2, 4)).astype(np.float32)
    x = jax.device_put(blocks.reshape(n * 2, 4), NamedSharding(mesh, P("i")))
    out, compiled = _compile_and_run(from_five, x)
    _answered(out, "from_five returns nothing yet; return position 5's block on every device")
    rows = book.hlo.collectives(compiled)
    ops = [r.op for r in rows]
    _need(
        "collective-permute" not in ops,
        f"The program passes blocks on with ppermute ({ops.count('collective-permute')} "
        "collective-permutes); use one collective that every device joins, and let each "
        "device choose what it puts in.",
    )
    gathers = [r for r in rows if r.op == "all-gather"]
    _need(
        not gathers,
        f"The program all-gathers {gathers[0].bytes if gathers else 0:,} bytes to every "
        f"device to keep one block of {blocks[5].nbytes} bytes; let each device contribute "
        "to a sum instead.",
    )
    _need(
        rows,
        "The program has no collective, so no device but position 5 can know its block; "
        "combine what the devices hold with one collective.",
    )
    _need(
        out.sharding.is_fully_replicated,
        f"The result comes out as {_spec_text(out.sharding.spec)}, the 8 copies side by "
        "side; return it with out_specs=P(), one copy that every device holds.",
    )
    for p, block in enumerate(_positions(out, mesh)):
        if np.array_equal(block, blocks[5]):
            continue
        _need(
            block.shape == blocks[5].shape,
            f"The device at position {p} holds a block of shape {block.shape}, not "
            f"{blocks[5].shape}.",
        )
        _need(
            not np.array_equal(block, blocks.sum(axis=0)),
            "Every device holds the sum of all 8 blocks: each one contributes its own; let "
            "position 5 contribute its block and the others zeros.",
        )
        same = [j for j in range(n) if np.array_equal(block, blocks[j])]
        _need(
            not same,
            f"The device at position {p} holds the block of position "
            f"{same[0] if same else 0}, not 5; compare jax.lax.axis_index('i') with 5.",
        )
        raise _Wrong(f"The device at position {p} does not hold the block of position 5.")
    _need(
        len(rows) == 1,
        f"The program has {len(rows)} collectives ({', '.join(ops)}); one all-reduce is enough.",
    )
    return (
        f"every device holds position 5's block, delivered by one {ops[0]} of "
        f"{rows[0].bytes} bytes per device, and out_specs=P() keeps one copy."
    )


def _ring_matmul_check(variant, what, seed):
    """Run the reader's per-device matmul on fresh A and B, both split by rows over 8 devices.

    Returns the result, the operands and the compiled collectives.
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import book.checks
    import book.hlo

    _need(callable(variant), f"Not answered yet: pass a function, not a {type(variant).__name__}.")
    mesh = _line_mesh("x")
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((48, 64), dtype=np.float32)
    B = rng.standard_normal((64, 40), dtype=np.float32)
    rows = NamedSharding(mesh, P("x", None))
    a, b = jax.device_put(A, rows), jax.device_put(B, rows)
    mapped = jax.shard_map(
        variant, mesh=mesh, in_specs=(P("x", None), P("x", None)), out_specs=P("x", None)
    )
    out, compiled = _compile_and_run(mapped, a, b)
    _answered(out, f"{what} returns nothing yet; return this device's rows of A @ B")
    out = np.asarray(out)
    try:
        book.checks.product_error(out, A, B)
    except AssertionError as err:
        raise _Wrong(f"{str(err)[:-1]}; return this device's {A.shape[0] // 8} rows.") from None
    return out, A, B, book.hlo.collectives(compiled)


def _wrong_row_blocks(out, A, B, n=8) -> list[int]:
    """The devices whose rows of ``out`` are not those of A @ B to float32 accuracy."""
    import book.checks

    bad = (book.checks.product_error(out, A, B) > book.checks.tolerance(A.shape[1])).any(axis=1)
    return sorted({int(r) // (A.shape[0] // n) for r in np.flatnonzero(bad)})


def _devices_text(positions, n=8) -> str:
    if len(positions) == n:
        return f"all {n} devices"
    return (
        "the devices at position"
        + "s" * (len(positions) > 1)
        + " "
        + ", ".join(map(str, positions))
    )


def _only_permutes(rows):
    others = sorted({r.op for r in rows} - {"collective-permute"})
    _need(
        not others,
        f"The program has {_with_article(others)}: pass the blocks of B around the ring "
        "with ppermute instead, one block at a time.",
    )


@_checker
def ch06_ring_right(ring_right_matmul):
    """Exercise 6.1: the ring of chapter 06 with the blocks of B travelling to the right.

    The program must consist of n - 1 collective-permutes of one block of B, each along
    ``to_right``, and give A @ B to float32 accuracy on fresh operands. The direction is
    checked first, so a ring still running to the left is named as such whatever its index.
    """
    out, A, B, rows = _ring_matmul_check(ring_right_matmul, "ring_right_matmul", 601)
    n, k = 8, B.shape[0] // 8
    _only_permutes(rows)
    left, right = _ring_pairs(n, -1), _ring_pairs(n, 1)
    _need(
        not any(set(r.groups) == left for r in rows),
        "The blocks travel to the left, as in ring_matmul; send them with to_right, and let "
        "the index follow.",
    )
    _need(
        all(set(r.groups) == right for r in rows),
        "A collective-permute sends along other pairs than to_right; each step passes every "
        "block to the next position, j to j + 1.",
    )
    bad = _wrong_row_blocks(out, A, B)
    _need(
        not bad,
        f"The rows of {_devices_text(bad)} differ from A @ B: after s steps to the right, "
        "device d holds the block device d - s started with, so it meets column block "
        "(d - s) % n of A.",
    )
    _need(
        len(rows) == n - 1,
        f"The program has {len(rows)} collective-permutes; {n - 1} steps bring the {n - 1} "
        "blocks a device lacks.",
    )
    _need(
        all(r.shape == (k, B.shape[1]) for r in rows),
        f"A collective-permute moves {list(rows[0].shape)}; each step should pass one block "
        f"of B, {[k, B.shape[1]]}.",
    )
    return (
        f"A @ B to float32 accuracy, from {n - 1} collective-permutes of one block of B each, "
        f"all to the right: {sum(r.bytes for r in rows):,} bytes sent per device, as many as "
        "the all-gather."
    )


@_checker
def ch06_both_ways(both_ways_matmul):
    """Exercise 6.2: whole blocks of B travel both ways, so the ring needs only n // 2 steps.

    The block n // 2 positions away is reached from both sides at once and must be used once:
    counting it twice, or never, is named. The program must be whole-block collective-permutes
    along the two neighbour rings, n - 1 of them, n // 2 in the longer direction.
    """
    out, A, B, rows = _ring_matmul_check(both_ways_matmul, "both_ways_matmul", 602)
    n, k, half = 8, B.shape[0] // 8, 8 // 2
    if _wrong_row_blocks(out, A, B):
        m = A.shape[0] // n
        meeting = np.zeros(out.shape)
        for d in range(n):
            j, mine = (d + half) % n, slice(d * m, (d + 1) * m)
            meeting[mine] = A[mine, j * k : (j + 1) * k].astype(np.float64) @ B[j * k : (j + 1) * k]
        for sign, why in (
            (1, "is added twice: it arrives from both sides at the last step; use it once"),
            (-1, "is never added: going one way, the loop must reach step n // 2"),
        ):
            _need(
                bool(_wrong_row_blocks(out - sign * meeting, A, B)),
                f"The block {half} positions away {why}.",
            )
        raise _Wrong(
            f"The rows of {_devices_text(_wrong_row_blocks(out, A, B))} differ from A @ B: "
            "going left, step s brings the block of device d + s, going right that of "
            "d - s, and each meets its own columns of A."
        )
    _only_permutes(rows)
    left, right = _ring_pairs(n, -1), _ring_pairs(n, 1)
    _need(
        all(set(r.groups) in (left, right) for r in rows),
        "A collective-permute sends along pairs that skip positions; on a ring only "
        "neighbours are linked, so pass blocks one hop per step, to_left or to_right.",
    )
    _need(
        all(r.shape == (k, B.shape[1]) for r in rows),
        f"A collective-permute moves {list(rows[0].shape)}; this exercise sends whole blocks "
        f"of B, {[k, B.shape[1]]}, both ways.",
    )
    lefts = sum(set(r.groups) == left for r in rows)
    rights = len(rows) - lefts
    _need(
        lefts and rights,
        f"All {len(rows)} collective-permutes go to the {'left' if lefts else 'right'}: that "
        f"is the one-way ring, {n - 1} steps one after the other; send blocks both ways.",
    )
    _need(
        lefts + rights == n - 1,
        f"The program has {lefts + rights} collective-permutes; each device needs the other "
        f"{n - 1} blocks once each.",
    )
    _need(
        max(lefts, rights) == half,
        f"{max(lefts, rights)} blocks travel one way and {min(lefts, rights)} the other, so "
        f"the last one arrives after {max(lefts, rights)} steps; balance them, {half} and "
        f"{n - 1 - half}.",
    )
    return (
        f"A @ B to float32 accuracy in {half} steps instead of {n - 1}: {n - 1} "
        f"collective-permutes of whole blocks of B, {lefts} to the left and {rights} to the "
        f"right, {sum(r.bytes for r in rows):,} bytes sent per device as before."
    )
