"""Checkers for chapters 5 and 6: collectives and collective matmuls written by hand."""

from __future__ import annotations

import numpy as np

from book import validate
from book.exercises.core import (
    Wrong,
    answered,
    checked_results,
    checker,
    compile_and_run,
    full_precision,
    line_mesh,
    need,
    numbers,
    returned,
    sizes,
    spec_text,
)

# Chapters 05 and 06: collectives written by hand, checked value by value and in the HLO ----


def _positions(out, mesh) -> list[np.ndarray]:
    """Each device's own block of ``out``, in the order of the mesh's positions."""
    held = {s.device: np.asarray(s.data) for s in out.addressable_shards}
    return [held[d] for d in mesh.devices.flat]


def _on_mesh(out, mesh, what: str, wanted: str):
    """The reader's result, refused unless it is an array that every device of ``mesh`` holds.

    A function passed without its ``jax.shard_map`` runs on one device and returns an array
    there; one that returns a Python value or a tuple returns no array at all.
    """
    import jax

    answered(out, f"{what} returns nothing yet; return {wanted}")
    if not isinstance(out, jax.Array):
        returned(out, what, wanted)
    need(
        set(out.sharding.device_set) == set(mesh.devices.flat),
        f"{what} gave an array on {len(out.sharding.device_set)} device(s), not on the "
        f"{mesh.size} of the mesh; map the function over the mesh with jax.shard_map, as the "
        "exercise's cell does.",
    )
    return out


def _ring_pairs(n, step) -> set[tuple[int, int]]:
    return {(j, (j + step) % n) for j in range(n)}


def _in_loop(compiled, rows) -> bool:
    """Whether some of ``rows`` sit in the body of a compiled loop (``scan``, ``fori_loop``).

    ``book.hlo.collectives`` lists such a collective once however often the loop runs, so
    counts and bytes read from the rows are per trip, not per program.
    """
    import book.hlo

    entry = book.hlo.instructions(compiled)
    names = {i.name for i in entry}
    return any(i.op == "while" for i in entry) and any(r.name not in names for r in rows)


def _blocks_added(block, blocks) -> np.ndarray | None:
    """How many times each of ``blocks`` was added to make ``block``, if it is such a sum."""
    basis = blocks.reshape(len(blocks), -1).T.astype(np.float64)
    target = np.asarray(block, np.float64).ravel()
    if basis.shape[0] != target.size:
        return None
    coef = np.linalg.lstsq(basis, target, rcond=None)[0]
    counts = np.rint(coef)
    return counts if np.array_equal(basis @ counts, target) else None


@checker
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

    mesh = line_mesh("i")
    n = mesh.size
    blocks = np.random.default_rng(501).integers(-9, 10, size=(n, 4, 4)).astype(np.float32)
    x = jax.device_put(blocks.reshape(n * 4, 4), NamedSharding(mesh, P("i")))
    stub = {"mesh": mesh, "in_specs": P("i"), "out_specs": P("i")}
    out, compiled = compile_and_run(ring_sum, x, stub=stub)
    _on_mesh(out, mesh, "ring_sum", "the sum of every device's block")
    rows = book.hlo.collectives(compiled)
    others = sorted({r.op for r in rows} - {"collective-permute"})
    need(
        not others,
        f"The program has {_with_article(others)}: build the sum from ppermute and "
        "additions only, as the exercise asks.",
    )
    total = blocks.sum(axis=0)
    for p, block in enumerate(_positions(out, mesh)):
        need(
            block.shape == total.shape,
            f"The device at position {p} holds a block of shape {block.shape}; the sum has "
            f"the shape of one block, {total.shape}.",
        )
        if np.array_equal(block, total):
            continue
        partial = [r for r in rows if len(r.groups) < n]
        need(
            not partial,
            f"A ppermute sends along only {len(partial[0].groups) if partial else 0} pairs, "
            "so a device that nobody sends to receives zeros; close the ring with "
            f"({n - 1}, 0).",
        )
        counts = _blocks_added(block, blocks)
        need(
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
            raise Wrong(
                f"The device at position {p} adds {whose} {often}; after n - 1 = {n - 1} "
                "steps every block has arrived once, so stop there."
            )
        need(
            len(missing) < n - 1,
            f"The device at position {p} holds only its own block; pass blocks around the "
            "ring with ppermute and add each one that arrives.",
        )
        need(
            not missing,
            f"The device at position {p} never adds the block{'s' * (len(missing) > 1)} of "
            f"position {', '.join(map(str, missing))}; it takes n - 1 = {n - 1} steps of the "
            f"ring for the {n - 1} other blocks to arrive.",
        )
        raise Wrong(f"The device at position {p} does not hold the sum of the 8 blocks.")
    if _in_loop(compiled, rows):
        return (
            f"every device holds the sum of all {n} blocks, built in a loop of "
            "collective-permutes and additions, with no all-reduce."
        )
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
    from book.lessons.collectives import labelled_blocks

    ids = [d.id for d in mesh.devices.flat]
    return labelled_blocks(ids, len(ids))


@checker
def ch05_predict_all_to_all(shape, held_at_3):
    """Exercise 5.2: each device's result of an all_to_all that stacks along dimension 0.

    The answer is read against the real collective, run here on chapter 05's ``rows``.
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    answered(shape, "set shape to a tuple, such as (2, 4)")
    answered(held_at_3, "set held_at_3 to the values the device at position 3 holds")
    mesh = line_mesh("i")
    rows_np = _chapter_05_rows(mesh)
    rows = jax.device_put(rows_np, NamedSharding(mesh, P("i")))

    def as_columns(block):
        return jax.lax.all_to_all(block, "i", split_axis=1, concat_axis=0, tiled=True)

    out = jax.shard_map(as_columns, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(rows)
    real = _positions(out, mesh)[3]
    yours = sizes(shape, "shape", "(2, 4)")
    need(
        yours != (1, 8),
        "(1, 8) is the shape with concat_axis=1, as in transpose_blocks; with concat_axis=0 "
        "the 8 parts a device receives are stacked along dimension 0.",
    )
    need(
        yours == real.shape,
        f"Each device's result does not have shape {yours}: it receives 8 parts of shape "
        "(1, 1), one from each device, and joins them along concat_axis=0.",
    )
    values = numbers(held_at_3, "held_at_3", "a list of the values").ravel()
    need(
        not np.array_equal(values, rows_np[3]),
        "Those are the values position 3 starts with; after the all_to_all it keeps only "
        "part 3 of its row and receives part 3 of every other device's row.",
    )
    need(
        np.array_equal(values, real.ravel()),
        f"Position 3 does not hold {values.tolist()}: it receives part 3 of every "
        "row, one value from each sender, in the order of the senders.",
    )
    return (
        f"each device holds a {real.shape} column, and position 3 holds column 3 of rows_np, "
        f"{real.ravel().tolist()}."
    )


@checker
def ch05_from_five(from_five):
    """Exercise 5.3: every device gets the block of position 5, by one collective, as ``P()``.

    Moving it with ppermute, or all-gathering every block to keep one, is rejected; the value is
    checked on every device's own copy.
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import book.hlo

    mesh = line_mesh("i")
    n = mesh.size
    blocks = np.random.default_rng(503).integers(-9, 10, size=(n, 2, 4)).astype(np.float32)
    x = jax.device_put(blocks.reshape(n * 2, 4), NamedSharding(mesh, P("i")))
    stub = {"mesh": mesh, "in_specs": P("i"), "out_specs": P()}
    out, compiled = compile_and_run(from_five, x, stub=stub)
    _on_mesh(out, mesh, "from_five", "position 5's block on every device")
    rows = book.hlo.collectives(compiled)
    ops = [r.op for r in rows]
    need(
        "collective-permute" not in ops,
        f"The program passes blocks on with ppermute ({ops.count('collective-permute')} "
        "collective-permutes); use one collective that every device joins, and let each "
        "device choose what it puts in.",
    )
    gathers = [r for r in rows if r.op == "all-gather"]
    need(
        not gathers,
        f"The program all-gathers {gathers[0].bytes if gathers else 0:,} bytes to every "
        f"device to keep one block of {blocks[5].nbytes} bytes; let each device contribute "
        "to a sum instead.",
    )
    need(
        rows,
        "The program has no collective, so no device but position 5 can know its block; "
        "combine what the devices hold with one collective.",
    )
    need(
        out.sharding.is_fully_replicated,
        f"The result comes out as {spec_text(out.sharding.spec)}, the 8 copies side by "
        "side; return it with out_specs=P(), one copy that every device holds.",
    )
    for p, block in enumerate(_positions(out, mesh)):
        if np.array_equal(block, blocks[5]):
            continue
        need(
            block.shape == blocks[5].shape,
            f"The device at position {p} holds a block of shape {block.shape}, not "
            f"{blocks[5].shape}.",
        )
        need(
            not np.array_equal(block, blocks.sum(axis=0)),
            "Every device holds the sum of all 8 blocks: each one contributes its own; let "
            "position 5 contribute its block and the others zeros.",
        )
        same = [j for j in range(n) if np.array_equal(block, blocks[j])]
        need(
            not same,
            f"The device at position {p} holds the block of position "
            f"{same[0] if same else 0}, not 5; compare jax.lax.axis_index('i') with 5.",
        )
        raise Wrong(f"The device at position {p} does not hold the block of position 5.")
    need(
        len(rows) == 1,
        f"The program has {len(rows)} collectives ({', '.join(ops)}); one all-reduce is enough.",
    )
    return (
        f"every device holds position 5's block, delivered by one {ops[0]} of "
        f"{rows[0].bytes} bytes per device, and out_specs=P() keeps one copy."
    )


def _ring_matmul_check(variant, what, seed):
    """Run the reader's per-device matmul on fresh A and B, both split by rows over 8 devices.

    Returns the result, the operands, the compiled collectives and whether they sit in a
    loop (a ``scan`` or ``fori_loop`` lists each of its collectives once).
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import book.checks
    import book.hlo

    need(callable(variant), f"Not answered yet: pass a function, not {validate.describe(variant)}.")
    mesh = line_mesh("x")
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((48, 64), dtype=np.float32)
    B = rng.standard_normal((64, 40), dtype=np.float32)
    rows = NamedSharding(mesh, P("x", None))
    a, b = jax.device_put(A, rows), jax.device_put(B, rows)
    mapped = jax.shard_map(
        checked_results(variant),
        mesh=mesh,
        in_specs=(P("x", None), P("x", None)),
        out_specs=P("x", None),
    )
    out, compiled = compile_and_run(mapped, a, b)
    full_precision(out, f"{what}'s result")
    out = np.asarray(_on_mesh(out, mesh, what, "this device's rows of A @ B"))
    try:
        book.checks.product_error(out, A, B)
    except AssertionError as err:
        raise Wrong(f"{str(err)[:-1]}; return this device's {A.shape[0] // 8} rows.") from None
    rows = book.hlo.collectives(compiled)
    return out, A, B, rows, _in_loop(compiled, rows)


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
    need(
        not others,
        f"The program has {_with_article(others)}: pass the blocks of B around the ring "
        "with ppermute instead, one block at a time.",
    )


@checker
def ch06_ring_right(ring_right_matmul):
    """Exercise 6.1: the ring of chapter 06 with the blocks of B travelling to the right.

    The program must consist of n - 1 collective-permutes of one block of B, each along
    ``to_right``, and give A @ B to float32 accuracy on fresh operands. The direction is
    checked first, so a ring still running to the left is named as such whatever its index.
    """
    out, A, B, rows, looped = _ring_matmul_check(ring_right_matmul, "ring_right_matmul", 601)
    n, k = 8, B.shape[0] // 8
    _only_permutes(rows)
    left, right = _ring_pairs(n, -1), _ring_pairs(n, 1)
    need(
        not any(set(r.groups) == left for r in rows),
        "The blocks travel to the left, as in ring_matmul; send them with to_right, and let "
        "the index follow.",
    )
    need(
        all(set(r.groups) == right for r in rows),
        "A collective-permute sends along other pairs than to_right; each step passes every "
        "block to the next position, j to j + 1.",
    )
    bad = _wrong_row_blocks(out, A, B)
    need(
        not bad,
        f"The rows of {_devices_text(bad)} differ from A @ B: after s steps to the right, "
        "device d holds the block device d - s started with, so it meets column block "
        "(d - s) % n of A.",
    )
    need(
        looped or len(rows) == n - 1,
        f"The program has {len(rows)} collective-permutes; {n - 1} steps bring the {n - 1} "
        "blocks a device lacks.",
    )
    need(
        all(r.shapes == ((k, B.shape[1]),) for r in rows),
        f"A collective-permute moves {list(rows[0].shapes[0])}; each step should pass one block "
        f"of B, {[k, B.shape[1]]}.",
    )
    if looped:
        return (
            "A @ B to float32 accuracy, from a loop whose collective-permute passes one block "
            "of B to the right at each step."
        )
    return (
        f"A @ B to float32 accuracy, from {n - 1} collective-permutes of one block of B each, "
        f"all to the right: {sum(r.bytes for r in rows):,} bytes sent per device, as many as "
        "the all-gather."
    )


@checker
def ch06_both_ways(both_ways_matmul):
    """Exercise 6.2: whole blocks of B travel both ways, so the ring needs only n // 2 steps.

    The block n // 2 positions away is reached from both sides at once and must be used once:
    counting it twice, or never, is named. The program must be whole-block collective-permutes
    along the two neighbour rings, n - 1 of them, n // 2 in the longer direction.
    """
    out, A, B, rows, looped = _ring_matmul_check(both_ways_matmul, "both_ways_matmul", 602)
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
            need(
                bool(_wrong_row_blocks(out - sign * meeting, A, B)),
                f"The block {half} positions away {why}.",
            )
        raise Wrong(
            f"The rows of {_devices_text(_wrong_row_blocks(out, A, B))} differ from A @ B: "
            "going left, step s brings the block of device d + s, going right that of "
            "d - s, and each meets its own columns of A."
        )
    _only_permutes(rows)
    left, right = _ring_pairs(n, -1), _ring_pairs(n, 1)
    need(
        all(set(r.groups) in (left, right) for r in rows),
        "A collective-permute sends along pairs that skip positions; on a ring only "
        "neighbours are linked, so pass blocks one hop per step, to_left or to_right.",
    )
    need(
        all(r.shapes == ((k, B.shape[1]),) for r in rows),
        f"A collective-permute moves {list(rows[0].shapes[0])}; this exercise sends whole blocks "
        f"of B, {[k, B.shape[1]]}, both ways.",
    )
    lefts = sum(set(r.groups) == left for r in rows)
    rights = len(rows) - lefts
    need(
        lefts and rights,
        f"All {len(rows)} collective-permutes go to the {'left' if lefts else 'right'}: that "
        f"is the one-way ring, {n - 1} steps one after the other; send blocks both ways.",
    )
    if looped:
        return (
            "A @ B to float32 accuracy, whole blocks of B travelling both ways in a loop. The "
            "loop's collective-permutes are listed once however often it runs, so its steps "
            f"cannot be counted here: with n = {n} it should run {half} of them."
        )
    need(
        lefts + rights == n - 1,
        f"The program has {lefts + rights} collective-permutes; each device needs the other "
        f"{n - 1} blocks once each.",
    )
    need(
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
