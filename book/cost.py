"""Textbook cost formulas, to set beside what ``book.hlo`` reads from compiled programs.

The collective formulas count bytes when ``n`` devices run the collective as a ring, the schedule
behind the usual cost model of these collectives (NCCL uses it among others; jax-ml/scaling-book
models TPU ICI collectives this way). One convention for ``S`` throughout: the size of the whole
array the collective works on, as one device would hold it. An all-gather's result, a
reduce-scatter's or all-reduce's full-size input, an all-to-all's global array (of which each
device holds ``S / n`` before and after).

Bytes become time in the alpha-beta model, ``ring_steps(op, n) * hop_latency + bytes /
bandwidth`` (``collective_seconds``): a fixed latency for each of the ring's sequential steps, plus
the bytes over the bandwidth. The first term grows with ``n``; for a fixed ``S`` the second does
not.

Every argument is checked first (``book.validate``): a formula fed ``nan``, a negative size or
a string would otherwise answer with a number that looks like a result.
"""

from __future__ import annotations

from book import validate

# Sizes and counts a formula takes: as large as the tokens of a whole training run.
MAX_COUNT = 2**62


def _check(n) -> int:
    return validate.whole(
        n, "A ring's number of devices", high=validate.MAX_DEVICES, error=validate.BadValue
    )


def _bytes(value, name: str = "The number of bytes") -> float:
    """A size in bytes: a finite number of at least 0 (a float, as averages and shares are)."""
    return validate.number(
        value, name, wanted="a number of bytes such as 1024", error=validate.BadValue
    )


def _size(value, name: str) -> int:
    return validate.whole(value, name, low=0, high=MAX_COUNT, error=validate.BadValue)


def matmul_flops(m: int, k: int, n: int, batch: int = 1) -> int:
    """FLOPs of an ``(m, k) @ (k, n)`` product: ``2 * m * k * n``.

    Each of the ``m * n`` outputs is a dot product of length ``k``: ``k`` multiplies and
    ``k - 1`` adds, which the convention (and XLA's ``cost_analysis``) rounds to one multiply
    and one add per multiply-accumulate.
    """
    m, k, n = _size(m, "m"), _size(k, "k"), _size(n, "n")
    return 2 * _size(batch, "batch") * m * k * n


def all_gather_bytes(result_bytes: float, n: int) -> float:
    """Bytes each device sends in an all-gather on a ring: ``(n - 1) / n * result_bytes``.

    Every device starts with ``1/n`` of the result and must receive the other ``n - 1`` pieces.
    On a ring each step forwards one piece to the next neighbour, so after ``n - 1`` steps every
    device has sent (and received) ``n - 1`` pieces of ``result_bytes / n``.
    """
    n, result_bytes = _check(n), _bytes(result_bytes)
    return (n - 1) / n * result_bytes


def reduce_scatter_bytes(input_bytes: float, n: int) -> float:
    """Bytes each device sends in a reduce-scatter on a ring: ``(n - 1) / n * input_bytes``.

    ``input_bytes`` is the full-size array each device holds before the reduction (``n`` times
    the scattered result). The ring passes partial sums: at each of ``n - 1`` steps a device adds
    its own piece to the partial sum it received and forwards one piece of ``input_bytes / n``.
    It is an all-gather run backwards, so it costs the same.
    """
    n, input_bytes = _check(n), _bytes(input_bytes)
    return (n - 1) / n * input_bytes


def all_reduce_bytes(nbytes: float, n: int) -> float:
    """Bytes each device sends in an all-reduce on a ring: ``2 * (n - 1) / n * nbytes``.

    The bandwidth-optimal all-reduce is a reduce-scatter (each device ends with the full sum of
    one ``1/n`` piece) followed by an all-gather of those pieces: twice ``(n - 1) / n * nbytes``.
    This is why an all-reduce costs about as much as an all-gather and a reduce-scatter together.
    """
    n, nbytes = _check(n), _bytes(nbytes)
    return 2 * (n - 1) / n * nbytes


def all_to_all_bytes(nbytes: float, n: int) -> float:
    """Bytes each device sends in an all-to-all of ``nbytes``: ``(n - 1) / n**2 * nbytes``.

    ``nbytes`` is the global array, all devices' parts together, as for the other formulas.

    Each device holds ``nbytes / n`` (an all-to-all keeps the size of each device's part); it
    splits its part into ``n`` pieces of ``nbytes / n**2``, keeps one and sends one to each of the
    other ``n - 1`` devices. This is what must leave each device, and what a switched network
    (NVSwitch, say) carries. On a ring, pieces for distant devices are forwarded through the ones
    between, so each link carries more than leaves a device: ``all_to_all_ring_link_bytes``.
    """
    n, nbytes = _check(n), _bytes(nbytes)
    return (n - 1) / (n * n) * nbytes


def all_to_all_ring_link_bytes(nbytes: float, n: int, bidirectional: bool = True) -> float:
    """Bytes each link of a ring carries in an all-to-all of a global array of ``nbytes``.

    Both directions together. Each device sends a piece of ``nbytes / n**2`` to each other device,
    and each piece travels from neighbour to neighbour until it arrives. On a bidirectional ring
    it takes the shorter way round (a piece going exactly half way splits evenly between the two
    ways). A piece to a device ``d`` steps away crosses ``min(d, n - d)`` links, which sum over
    ``d`` to ``n**2 // 4``; ``n`` devices send such pieces and the ring has ``n`` links, all loaded
    alike, so each link carries ``n**2 // 4 / n**2 * nbytes``: exactly ``nbytes / 4`` for even
    ``n``. An all-gather of the same array puts ``(n - 1) / n * nbytes`` on each link, so for even
    ``n`` the all-to-all costs ``n / (4 * (n - 1))`` of it: 2/7 at ``n = 8``, a quarter as ``n``
    grows. On a one-way ring a piece crosses ``d`` links, which sum to ``n * (n - 1) / 2``, so
    each link carries ``(n - 1) / (2 * n) * nbytes``, half the all-gather's.
    """
    n, nbytes = _check(n), _bytes(nbytes)
    if validate.flag(bidirectional, "bidirectional", error=validate.BadValue):
        return n * n // 4 / (n * n) * nbytes
    return (n - 1) / (2 * n) * nbytes


def collective_permute_bytes(nbytes: float) -> float:
    """Bytes each device sends in a collective-permute: its whole buffer, once."""
    return _bytes(nbytes)


def ring_bytes(row) -> float:
    """The formula's bytes sent per device for a row of ``book.hlo.collectives``.

    The row gives the result size on one device and the group size ``n``; the formulas above want
    the whole array: the result (all-gather, all-reduce), the full input (reduce-scatter, ``n``
    times its result) or the global array (all-to-all, ``n`` times each device's part), so this
    picks the right one. A collective-permute in which every device sends to itself moves
    nothing.
    """
    from book.hlo import Collective

    if not isinstance(row, Collective):
        raise validate.WrongKind(
            f"ring_bytes takes a row of book.hlo.collectives(compiled), not "
            f"{validate.describe(row)}."
        )
    n = row.group_size
    if row.op == "all-gather":
        return all_gather_bytes(row.bytes, n)
    if row.op == "reduce-scatter":
        return reduce_scatter_bytes(row.bytes * n, n)
    if row.op == "all-reduce":
        return all_reduce_bytes(row.bytes, n)
    if row.op == "all-to-all":
        return all_to_all_bytes(row.bytes * n, n)
    if row.op == "collective-permute":
        moves = any(source != target for source, target in row.groups)
        return collective_permute_bytes(row.bytes) if moves else 0.0
    raise validate.BadValue(f"No ring formula for {validate.describe(row.op)}.")


_STEPS = {"all-gather": 1, "reduce-scatter": 1, "all-to-all": 1, "all-reduce": 2}


def ring_steps(op: str, n: int) -> int:
    """Sequential neighbour-to-neighbour steps of ``op`` on a one-way ring of ``n`` devices.

    All-gather, reduce-scatter and all-to-all take ``n - 1`` steps, an all-reduce twice that (a
    reduce-scatter, then an all-gather), a collective-permute one. Each step pays a fixed latency
    whatever its size, so this count times the latency of one hop is the alpha-beta model's
    latency term. It is the count NCCL's own cost model uses for its ring; a schedule that sends
    both ways round at once needs about half as many.
    """
    n, op = _check(n), validate.plain(op)
    if not isinstance(op, str) or op not in (*_STEPS, "collective-permute"):
        raise validate.BadValue(
            f"No ring schedule for {validate.describe(op)}; use one of "
            f"{', '.join(map(repr, _STEPS))} or 'collective-permute'."
        )
    if n == 1:
        return 0
    if op == "collective-permute":
        return 1
    return _STEPS[op] * (n - 1)


def collective_seconds(
    link_bytes: float, steps: int, bandwidth: float, hop_latency: float
) -> float:
    """Alpha-beta time of a collective: ``steps * hop_latency + link_bytes / bandwidth``.

    ``link_bytes`` is what the collective puts on each link of the ring, both directions together
    (for all-gather, reduce-scatter and all-reduce, what leaves each device; on a switched network,
    what leaves each device for every collective), ``bandwidth`` the bytes per second one device
    sends along the mesh axis the collective runs over, both ways round together, and
    ``hop_latency`` the fixed cost of one step in seconds. Both terms are best cases: real
    collectives reach less than the peak bandwidth and pay start-up costs this model leaves out.
    """
    link_bytes = _bytes(link_bytes, "link_bytes")
    steps = _size(steps, "steps")
    bandwidth = validate.number(
        bandwidth,
        "bandwidth",
        above=True,
        wanted="a positive number of bytes per second such as 450e9",
        error=validate.BadValue,
    )
    hop_latency = validate.number(
        hop_latency,
        "hop_latency",
        wanted="a number of seconds such as 1e-6",
        error=validate.BadValue,
    )
    return steps * hop_latency + link_bytes / bandwidth
