"""Checkers for chapters 1 to 4: devices, meshes, sharded arrays, and what the compiler makes
of them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from book import validate
from book.exercises.core import (
    Wrong,
    answered,
    callable_with,
    checked_results,
    checker,
    first_sentence,
    full_precision,
    function,
    ints,
    need,
    numbers,
    returned,
    sizes,
    spec_text,
    whole,
)
from book.exercises.core import spec as _spec  # ch02_spec_for_64_bytes names its answer spec

# Chapter 01 ------------------------------------------------------------------------------


def _linked(a, b) -> bool:
    return sum(abs(p - q) for p, q in zip(a, b)) <= 1


@checker
def ch01_chip_rows(chip_rows):
    """Exercise 1.1: a 4x2 grid of the v3-8 cores, one chip per row, rows following the ring."""
    from book.devices import tpu_v3_8

    cores = tpu_v3_8()
    function(chip_rows, "chip_rows", (list(cores),), "(cores)")
    grid = chip_rows(list(cores))
    answered(grid, "chip_rows returns nothing yet; return a 4x2 array of the cores")
    if isinstance(grid, Iterator):  # NumPy would hold the generator itself, shape ()
        returned(grid, "chip_rows", "a 4x2 array of the cores, or a list of its rows")
    try:
        grid = np.asarray(grid, dtype=object)
    except Exception:  # noqa: BLE001 - a ragged or self-holding list
        returned(grid, "chip_rows", "a 4x2 array of the cores")
    need(grid.shape == (4, 2), f"The grid has shape {grid.shape}; it should be (4, 2).")

    def which(c) -> int:  # a core equal to one of the v3-8's, as the chapter's v3_8 holds
        same = (k.id for k in cores if type(c) is type(k) and c == k)
        return next(same, -1)

    ids = sorted(which(c) for c in grid.ravel())
    need(ids == list(range(8)), "The grid should hold each of the eight cores exactly once.")
    for r, row in enumerate(grid):
        need(
            row[0].coords == row[1].coords,
            f"Row {r} holds cores {row[0].id} and {row[1].id}, which sit on different chips.",
        )
    for r in range(4):
        a, b = grid[r, 0].coords, grid[(r + 1) % 4, 0].coords
        need(
            _linked(a, b),
            f"Rows {r} and {(r + 1) % 4} hold chips {a[:2]} and {b[:2]}, which share no "
            "direct link, so the ring along 'data' takes a detour.",
        )
    return "each row is one chip, and consecutive rows (wrapping around) are linked chips."


@checker
def ch01_reversed_mesh(reversed_mesh):
    """Exercise 1.2: a 2x2x2 Mesh over the devices in reverse id order, with explicit types."""
    import jax
    from jax.sharding import AxisType, Mesh

    devices = jax.devices()[:8]
    want = [d.id for d in reversed(devices)]  # before the reader's code may change the list
    function(reversed_mesh, "reversed_mesh", (list(devices),), "(devices)")
    mesh = reversed_mesh(list(devices))
    answered(mesh, "reversed_mesh returns nothing yet; return a jax.sharding.Mesh")
    need(
        isinstance(mesh, Mesh),
        f"reversed_mesh returned {validate.describe(mesh)}, not a Mesh; return "
        "jax.sharding.Mesh(...).",
    )
    need(
        tuple(mesh.axis_names) == ("pipe", "data", "model"),
        f"The axes are named {tuple(mesh.axis_names)}; use ('pipe', 'data', 'model').",
    )
    need(mesh.devices.shape == (2, 2, 2), f"The mesh has shape {mesh.devices.shape}, not 2x2x2.")
    order = [d.id for d in mesh.devices.ravel()]
    need(order == want, f"Read in order, the mesh holds devices {order}; it should be {want}.")
    need(
        all(t == AxisType.Explicit for t in mesh.axis_types),
        f"The axis types are {mesh.axis_types}; pass axis_types=(AxisType.Explicit,) * 3.",
    )
    return "a 2x2x2 mesh over the devices in reverse order, with explicit axis types."


# Chapter 02 ------------------------------------------------------------------------------


def _mesh_2x4():
    import jax
    from jax.sharding import AxisType

    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


@checker
def ch02_predict(shard_shape, replication):
    """Exercise 2.1: shard shape and replication of (16, 8, 4) under P(None, ('model', 'data'))."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    answered(shard_shape, "set shard_shape to a tuple such as (16, 8, 4)")
    answered(replication, "set replication to a whole number")
    shard_shape = sizes(shard_shape, "shard_shape")
    replication = whole(replication, "replication", low=0, example=1)
    x = jax.device_put(
        np.zeros((16, 8, 4), np.float32), NamedSharding(_mesh_2x4(), P(None, ("model", "data")))
    )
    real_shape = x.sharding.shard_shape(x.shape)
    copies = len(x.sharding.device_set) // len({str(s.index) for s in x.addressable_shards})
    need(
        len(shard_shape) == len(real_shape),
        f"shard_shape has {len(shard_shape)} entries; the array (16, 8, 4) has 3 dimensions, "
        "and each block has as many.",
    )
    need(
        tuple(shard_shape) == real_shape,
        f"The shard shape is not {tuple(shard_shape)}: dimension 1 is split over both mesh "
        "axes together, 4 x 2 = 8 ways.",
    )
    need(
        replication == copies,
        f"Not {replication} copies: the spec uses every mesh axis, so each block lives on "
        f"{copies} device.",
    )
    return f"each device holds a {real_shape} block and nothing is replicated."


@checker
def ch02_rows_on_device_1(rows):
    """Exercise 2.2: which rows of the 8x8 matrix the device at data=0, model=1 holds under
    P(('model', 'data')): device 1 on mock devices, another where make_mesh orders a TPU's."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    answered(rows, "set rows to the list of row numbers the device at data=0, model=1 holds")
    if isinstance(rows, (set, frozenset)):  # the rows are compared sorted
        rows = sorted(rows, key=repr)
    given = numbers(rows, "rows", "[2]").ravel()
    need(
        (given == np.round(given)).all(),
        f"rows should be whole row numbers, such as [2], not {validate.describe(rows)}.",
    )
    rows = [int(r) for r in given]
    mesh = _mesh_2x4()
    x = jax.device_put(np.arange(64).reshape(8, 8), NamedSharding(mesh, P(("model", "data"), None)))
    device = mesh.devices[0, 1]
    shard = next(s for s in x.addressable_shards if s.device == device)
    real = list(range(*shard.index[0].indices(8)[:2]))
    shown = f"rows {sorted(rows)}" if len(rows) <= 8 else f"{len(rows):,} rows"
    need(
        sorted(rows) == real,
        f"The device at data=0, model=1 does not hold {shown}: with 'model' as the major "
        "axis, block b sits at model = b // 2, data = b % 2.",
    )
    return f"the device at data=0, model=1 (device {device.id}) holds row {real[0]}."


@checker
def ch02_spec_for_64_bytes(spec):
    """Exercise 2.3: a spec that stores exactly 64 bytes of an 8x8 int32 matrix per device."""
    import jax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    held_apart = set()
    if isinstance(spec, PartitionSpec):  # frozensets, empty unless chapter 4's are named
        held_apart = set(getattr(spec, "unreduced", ())) | set(getattr(spec, "reduced", ()))
    need(  # chapter 4's partial sums: no array placed on devices holds them
        not held_apart,
        f"spec names unreduced or reduced axes {sorted(held_apart)}; an array placed on "
        "devices holds whole values, so give a spec without unreduced= or reduced=.",
    )
    spec = _spec(spec, "spec")
    mesh = jax.make_mesh((2, 2, 2), ("pipe", "data", "model"), axis_types=(AxisType.Explicit,) * 3)
    try:
        x = jax.device_put(np.arange(64, dtype=np.int32).reshape(8, 8), NamedSharding(mesh, spec))
    except Exception as err:  # JAX's own words for an impossible spec
        raise Wrong(f"JAX cannot use {spec_text(spec)}: {first_sentence(err)}.") from None
    per_device = max(s.data.nbytes for s in x.addressable_shards)
    ways = 256 // per_device
    need(
        per_device == 64,
        f"{spec} stores {per_device} bytes per device: it "
        + (f"splits the matrix {ways} ways" if ways > 1 else "does not split the matrix")
        + ", and 64 bytes needs 4 ways.",
    )
    return f"{spec} splits the matrix 4 ways and keeps 2 copies of every block."


# Chapters 03 and 04: what the compiler makes of the reader's program -----------------------


def _run(fn, *args):
    """The reader's result and compiled program; ``fn`` is jitted here if it is not already.

    A ``ShardingTypeError`` is the lesson of chapter 04, not a bug in the reader's code, so it
    gets its own sentence instead of the generic one.
    """
    import jax

    callable_with(fn, args)
    jitted = fn if hasattr(fn, "lower") else jax.jit(checked_results(fn))
    try:
        out = jitted(*args)
        if out is None:
            return None, None
        return out, jitted.lower(*args).compile()
    except Exception as err:
        if type(err).__name__ != "ShardingTypeError":
            raise
        raise Wrong(
            f"JAX cannot decide a sharding in your function ({first_sentence(err)}); "
            "settle it with out_sharding= or jax.reshard."
        ) from None


def _same(actual, expected) -> bool:
    return np.array_equal(np.asarray(actual), expected)


def _device_groups(row, mesh) -> list[list[int]]:
    """A collective's groups as device ids: its members are positions in the mesh's order."""
    at = list(mesh.devices.flat)
    return [[at[p].id for p in group] for group in row.groups]


def _padded(spec, ndim) -> tuple:
    return tuple(spec) + (None,) * (ndim - len(tuple(spec)))


@checker
def ch03_no_communication(a_spec, b_spec):
    """Exercise 3.1: layouts on the 2x4 mesh whose product needs no communication at all.

    Three conditions together: no collective in the compiled product, each output block on one
    device only (no repeated work), and neither operand stored whole on a device (no replicated
    shortcut). They leave only one answer up to swapping the axes: A split by rows over one
    mesh axis, B by columns over the other.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding

    import book.hlo

    a_spec, b_spec = _spec(a_spec, "a_spec"), _spec(b_spec, "b_spec")
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    A, B = ints((32, 64), 31), ints((64, 16), 32)
    placed = []
    for name, value, spec in (("A", A, a_spec), ("B", B, b_spec)):
        try:
            placed.append(jax.device_put(value, NamedSharding(mesh, spec)))
        except Exception as err:  # JAX's own words for an impossible spec
            raise Wrong(f"JAX cannot place {name} with {spec}: {first_sentence(err)}.") from None
    a, b = placed
    matmul = jax.jit(jnp.matmul)
    out = matmul(a, b)
    need(_same(out, A @ B), "The product differs from NumPy's, which should not happen.")
    found = [r.op for r in book.hlo.collectives(matmul.lower(a, b).compile())]
    need(
        "all-reduce" not in found,
        f"The compiled product sums partial products with an all-reduce: with {a_spec} and "
        f"{b_spec} the contraction dimension K is split, so keep K whole on both sides.",
    )
    need(
        not found,
        f"The compiled product needs {' and '.join(found)}: the compiler must move an operand, "
        "because the two splits cannot be combined where they are.",
    )
    for name, x in (("A", a), ("B", b)):
        need(
            x.sharding.shard_shape(x.shape) != x.shape,
            f"With {x.sharding.spec} every device stores the whole of {name}; split it over a "
            "mesh axis the other operand leaves free.",
        )
    copies = out.size // int(np.prod(out.sharding.shard_shape(out.shape)))
    need(
        copies == 8,
        f"The output is split only {copies} ways, so {8 // copies} devices compute every block; "
        "use the other mesh axis for the other output dimension.",
    )
    return (
        f"the output comes out as {out.sharding.spec}, one block per device, and the compiled "
        "product has no collective at all."
    )


@checker
def ch03_gram(gram):
    """Exercise 3.2: ``a.T @ a`` for ``a`` split by rows, left split by rows: no all-gather.

    Each device's rows of ``a`` give a partial ``aᵀa``; the cheap plan sums those partial
    products and keeps each device's rows of the sum (a reduce-scatter), while the expensive
    one all-gathers ``a``. A reduce-scatter passes on every platform. The CPU compiler of jax
    0.10 and 0.12 writes it as an all-reduce followed by a dynamic-slice of its result, so on
    CPU that passes too, once the slice is found taking the all-reduce's result, and is quoted.
    """
    import jax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    A = ints((128, 16), 33)
    a = jax.device_put(A, NamedSharding(mesh, P("x", None)))
    out, compiled = _run(gram, a)
    answered(out, "gram returns nothing yet; return a.T @ a")
    full_precision(out, "The result")
    need(
        getattr(out, "shape", None) == (16, 16) and _same(out, A.T @ A),
        "The result is not a.T @ a: check the order of the transpose and the product.",
    )
    spec = out.sharding.spec
    need(
        not out.sharding.is_fully_replicated,
        "Every device ends up with the whole of a.T @ a; ask for it split by rows with "
        "out_shardings= (or a sharding constraint on the product).",
    )
    need(
        not out.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "x")), 2),
        "The product is split by columns, P(None, 'x'); the values match because aᵀa is "
        "symmetric, but the exercise asks for rows, P('x', None).",
    )
    need(
        out.sharding.is_equivalent_to(NamedSharding(mesh, P("x", None)), 2),
        f"The product comes out as {spec}; ask for P('x', None), each device keeping its rows.",
    )
    import book.display
    import book.hlo

    rows = book.hlo.collectives(compiled)
    gathered = [r for r in rows if r.op == "all-gather"]
    need(
        not gathered,
        f"The compiled program all-gathers "
        f"{book.display.shape_text(gathered[0]) if gathered else '[]'}: it "
        "moves a to every device instead of summing each device's partial product.",
    )
    ops = [r.op for r in rows]
    if ops == ["reduce-scatter"] or jax.default_backend() != "cpu":
        need(
            ops == ["reduce-scatter"],
            f"Expected one reduce-scatter of the partial products, but the program has "
            f"{ops or 'none'}.",
        )
        return (
            "each device keeps its rows of aᵀa, the partial products summed with a reduce-scatter."
        )
    need(
        ops == ["all-reduce"],
        f"Expected one reduction of the partial products, but the program has {ops or 'none'}.",
    )
    (reduce,) = book.hlo.instructions(compiled, "all-reduce")
    cuts = [
        i
        for i in book.hlo.instructions(compiled, "dynamic-slice")
        if f"%{reduce.name}" in i.operands
    ]
    need(
        bool(cuts),
        "The program sums the partial products but never cuts out each device's rows.",
    )
    cut = cuts[0]
    line = book.display.instruction_text(cut, 10_000).splitlines()[0].removeprefix("ROOT ")
    what = f"`{line}`" + (f" (a fusion of {', '.join(cut.main_fused)})" if cut.fused else "")
    return (
        "each device keeps its rows of aᵀa: the partial products are summed with an all-reduce "
        f"and each device's rows cut out by {what}, the CPU compiler's way of writing a "
        "reduce-scatter."
    )


@checker
def ch03_sum_groups(groups, out_spec):
    """Exercise 3.3: which devices add together in ``a.sum(axis=0)``, a split P('data', 'model').

    Summing over rows combines blocks that differ only in their ``data`` index, so the
    all-reduce runs within each column of the mesh, and the sums stay split over ``model``.
    """
    import jax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    import book.hlo

    answered(groups, "set groups to a list of lists of device ids")
    out_spec = _spec(out_spec, "out_spec")
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    A = ints((16, 32), 34)
    a = jax.device_put(A, NamedSharding(mesh, PartitionSpec("data", "model")))
    column_sums = jax.jit(lambda a: a.sum(axis=0))
    out = column_sums(a)
    (reduce,) = book.hlo.collectives(column_sums.lower(a).compile())
    real = {frozenset(g) for g in _device_groups(reduce, mesh)}
    if not isinstance(groups, (list, tuple)) and hasattr(groups, "__array__"):
        with contextlib.suppress(Exception):  # a NumPy or JAX array of ids, one row a group
            groups = np.asarray(groups).tolist()
    groups = validate.plain(groups)
    need(
        isinstance(groups, (list, tuple)),
        "groups should be a list of lists of device ids, e.g. [[0, 1], [2, 3]], not "
        f"{validate.describe(groups)}.",
    )
    kinds = (list, tuple, set, frozenset, range, np.ndarray)  # their order does not matter
    for g in groups:
        need(
            isinstance(validate.plain(g), kinds),
            f"Each group should be a list of device ids, such as [0, 4], not "
            f"{validate.describe(g)}.",
        )
    listed = [
        [
            whole(d, "Each device id", low=0, high=mesh.size - 1, example=0)
            for d in (g.tolist() if isinstance(g, np.ndarray) else validate.plain(g))
        ]
        for g in groups
    ]
    every = [d for g in listed for d in g]
    need(len(every) == len(set(every)), "A device belongs to one group: list each id once.")
    need(all(listed), "groups holds an empty group; every group adds at least one device.")
    yours = {frozenset(g) for g in listed}
    mesh_rows = {frozenset(d.id for d in row) for row in mesh.devices}
    need(
        yours != mesh_rows,
        "Those are the rows of the mesh, devices with the same data index; summing a's rows "
        "adds blocks that differ in their data index.",
    )
    need(
        yours == real,
        f"The all-reduce adds within {sorted(sorted(g) for g in real)}: one group per column of "
        "the mesh, the devices that hold the same columns of a.",
    )
    named = {a for part in out_spec for a in (part if type(part) is tuple else (part,))}
    need(
        len(out_spec) <= out.ndim and named - {None} <= set(mesh.axis_names),
        f"out_spec should describe the 1-D sums on the mesh's axes 'data' and 'model', such "
        f"as P(None), not {spec_text(out_spec)}.",
    )
    need(
        NamedSharding(mesh, out_spec).is_equivalent_to(out.sharding, 1),
        f"The sums come out as {spec_text(out.sharding.spec)}, not {spec_text(out_spec)}: "
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


@checker
def ch04_predict_types(transposed, concatenated, sliced, moves_data):
    """Exercise 4.1: the sharding in the type of three results, and which of them move data.

    The point is that the type does not tell the cost: a concatenation and a slice keep ``x``'s
    spec, but the blocks of the result are not the blocks each device holds. The answers are
    checked under ``jax.jit``; the verdict also says what the slice does outside it.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import book.hlo

    answers = {"transposed": transposed, "concatenated": concatenated, "sliced": sliced}
    answers = {name: _spec(answer, name) for name, answer in answers.items()}
    answered(moves_data, "set moves_data to a set of names, such as {'sliced'}")
    if isinstance(moves_data, str):
        moves_data = {moves_data}
    elif isinstance(moves_data, np.ndarray):  # an array of names: Python texts in a list
        moves_data = moves_data.ravel().tolist()
    elif isinstance(moves_data, type({}.keys())):
        moves_data = list(moves_data)
    container = isinstance(moves_data, (set, frozenset, list, tuple))
    odd = [m for m in moves_data if not isinstance(m, str)] if container else []
    given = validate.describe(moves_data)
    if odd:  # bytes shown as typed: b'sliced' reads as the slip it is
        first = repr(odd[0])[:40] if isinstance(odd[0], bytes) else validate.describe(odd[0])
        given = f"a {type(moves_data).__name__} holding {first}"
    need(
        container and not odd,
        f"moves_data should be a set of names, such as {{'sliced'}}, not {given}.",
    )
    moves_data = set(moves_data)
    unknown = moves_data - set(answers)
    need(
        not unknown,
        f"moves_data names {validate.describe(sorted(unknown))}; use names from {sorted(answers)}.",
    )
    cases = {
        "transposed": lambda x: x.T,
        "concatenated": lambda x: jnp.concatenate([x, x], axis=1),
        "sliced": lambda x: x[:, : x.shape[1] // 2],
    }
    moving = {}  # name: the collectives its compiled program runs
    with jax.set_mesh(_explicit_2x4()):
        x = jax.device_put(ints((16, 32), 41), P("data", "model"))
        for name, fn in cases.items():
            code = _CH04_CODE[name]
            jitted = jax.jit(fn)
            out = jitted(x)
            real = jax.typeof(out).sharding.spec
            need(
                _padded(answers[name], out.ndim) == _padded(real, out.ndim),
                f"{code} has type {jax.typeof(out)}, so its spec is {spec_text(real)}, not "
                f"{spec_text(answers[name])}.",
            )
            ops = [r.op for r in book.hlo.collectives(jitted.lower(x).compile())]
            if ops:
                moving[name] = ", ".join(f"{ops.count(op)} x {op}" for op in dict.fromkeys(ops))
        try:
            cases["sliced"](x)
            eager = "outside jax.jit the slice works as well"
        except Exception as err:  # what this JAX does eagerly: reported, not the reader's fault
            eager = (
                f"outside jax.jit the same slice raises a {type(err).__name__}, because eagerly "
                "JAX slices a sharded array with a gather, whose sharding it will not guess"
            )
    for name in sorted(set(moving) - moves_data):
        need(
            False,
            f"{_CH04_CODE[name]} moves data too: its type keeps a split over 'model', but "
            "the result's blocks are not the blocks of x each device holds.",
        )
    for name in sorted(moves_data - set(moving)):
        need(
            False,
            f"{_CH04_CODE[name]} moves nothing: every device makes its block of the result "
            "from its own block of x.",
        )
    return (
        "x.T is free, while the concatenation and the slice keep the spec of x in their type "
        f"yet move data: compiled here, the concatenation runs {moving['concatenated']} and the "
        f"slice {moving['sliced']}; {eager}."
    )


@checker
def ch04_mlp(mlp):
    """Exercise 4.2: chapter 03's perceptron on explicit axes, returned with the type of x.

    The one right plan sums the second product's partial products with a single all-reduce
    within each 'model' group; gathering the hidden activation or the second weight is
    rejected. An all-reduce is what every platform emits here (the result is whole along
    'model'), so the check reads the same on mock CPU devices as on accelerators.
    """
    import jax
    from jax.sharding import PartitionSpec as P

    import book.display
    import book.hlo

    mesh = _explicit_2x4()
    X, W1, W2 = ints((16, 32), 42), ints((32, 64), 43), ints((64, 32), 44)
    with jax.set_mesh(mesh):
        x = jax.device_put(X, P("data", None))
        w1 = jax.device_put(W1, P(None, "model"))
        w2 = jax.device_put(W2, P("model", None))
        out, compiled = _run(mlp, x, w1, w2)
        answered(out, "mlp returns nothing yet; return relu(x @ w1) @ w2")
        kind = jax.typeof(out)
    full_precision(out, "The result")
    need(
        getattr(out, "shape", None) == X.shape and _same(out, np.maximum(X @ W1, 0) @ W2),
        "The values differ from relu(x @ w1) @ w2 computed on one device.",
    )
    spec = _padded(kind.sharding.spec, 2)
    need(
        spec != ("data", "model"),
        f"The result has type {kind}: still split over 'model', the reduce-scatter answer; "
        "the next layer wants the type of x, P('data', None).",
    )
    need(spec == ("data", None), f"The result has type {kind}; it should be P('data', None).")
    rows = book.hlo.collectives(compiled)
    for r in rows:
        if r.op != "all-gather":
            continue
        what = {
            (8, 64): "the hidden activation, which should never leave its device",
            (64, 32): "w2, a whole copy of the weight on every device",
        }.get(r.shapes[0], "an operand")
        raise Wrong(
            f"The program all-gathers {what} ({book.display.shape_text(r)} per device); let the "
            "second product's partial sums be added instead."
        )
    model_groups = [[d.id for d in row] for row in mesh.devices]
    need(
        [r.op for r in rows] == ["all-reduce"] and _device_groups(rows[0], mesh) == model_groups,
        f"Expected one all-reduce within each 'model' group {model_groups}, but the program has "
        f"{[(r.op, _device_groups(r, mesh)) for r in rows] or 'no collective'}.",
    )
    return (
        f"the result is {kind}, and the only communication is one all-reduce of "
        f"{rows[0].bytes:,} bytes per device within each 'model' group."
    )


@checker
def ch04_small_operand(product):
    """Exercise 4.3: ``a @ v`` with a small ``a`` and a large ``v``, moving only ``a``.

    Any collective whose result is larger than the whole of ``a`` must carry (part of) ``v``,
    so that is the test. It holds on every platform: only what moves is checked, not which
    collectives the compiler picks to move it.
    """
    import jax
    from jax.sharding import PartitionSpec as P

    import book.display
    import book.hlo

    A, V = ints((8, 32), 45), ints((32, 256), 46)
    with jax.set_mesh(_explicit_2x4()):
        a = jax.device_put(A, P("data", None))
        v = jax.device_put(V, P(None, "data"))
        out, compiled = _run(product, a, v)
        answered(out, "product returns nothing yet; return a @ v")
        kind = jax.typeof(out)
    need(
        getattr(out, "shape", None) == (8, 256) and _same(out, A @ V),
        "The values differ from a @ v computed on one device.",
    )
    rows = book.hlo.collectives(compiled)
    big = max(rows, key=lambda r: r.bytes, default=None)
    need(
        big is None or big.bytes <= A.nbytes,
        f"The program moves v: its {big.op if big else ''} delivers "
        f"{big.bytes if big else 0:,} bytes per device, more than all of a ({A.nbytes:,} "
        "bytes); move a instead.",
    )
    moved = ", ".join(f"{r.op} {book.display.shape_text(r)}" for r in rows)
    return f"only a-sized pieces move ({moved}), and the result has type {kind}."
