"""Textbook cost formulas, to set beside what ``book.hlo`` reads from compiled programs.

The collective formulas count the bytes one device sends when ``n`` devices run the collective
as a ring: the schedule used by NCCL and by TPU interconnects for large messages, and the one
whose cost does not grow with ``n`` for a fixed result size. Every device both sends and receives
this amount, so dividing by a link's bandwidth gives the time the transfer needs at best. The
exception is the all-to-all, whose pieces for distant devices cross several links: what each
link of a ring carries grows with ``n`` (``all_to_all_ring_link_bytes``).
"""

from __future__ import annotations


def _check(n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"A ring needs a positive whole number of devices, not {n!r}.")


def matmul_flops(m: int, k: int, n: int, batch: int = 1) -> int:
    """FLOPs of an ``(m, k) @ (k, n)`` product: ``2 * m * k * n``.

    Each of the ``m * n`` outputs is a dot product of length ``k``: ``k`` multiplies and
    ``k - 1`` adds, which the convention (and XLA's ``cost_analysis``) rounds to one multiply
    and one add per multiply-accumulate.
    """
    return 2 * batch * m * k * n


def all_gather_bytes(result_bytes: float, n: int) -> float:
    """Bytes each device sends in an all-gather on a ring: ``(n - 1) / n * result_bytes``.

    Every device starts with ``1/n`` of the result and must receive the other ``n - 1`` pieces.
    On a ring each step forwards one piece to the next neighbour, so after ``n - 1`` steps every
    device has sent (and received) ``n - 1`` pieces of ``result_bytes / n``.
    """
    _check(n)
    return (n - 1) / n * result_bytes


def reduce_scatter_bytes(input_bytes: float, n: int) -> float:
    """Bytes each device sends in a reduce-scatter on a ring: ``(n - 1) / n * input_bytes``.

    ``input_bytes`` is the full-size array each device holds before the reduction (``n`` times
    the scattered result). The ring passes partial sums: at each of ``n - 1`` steps a device adds
    its own piece to the partial sum it received and forwards one piece of ``input_bytes / n``.
    It is an all-gather run backwards, so it costs the same.
    """
    _check(n)
    return (n - 1) / n * input_bytes


def all_reduce_bytes(nbytes: float, n: int) -> float:
    """Bytes each device sends in an all-reduce on a ring: ``2 * (n - 1) / n * nbytes``.

    The bandwidth-optimal all-reduce is a reduce-scatter (each device ends with the full sum of
    one ``1/n`` piece) followed by an all-gather of those pieces: twice ``(n - 1) / n * nbytes``.
    This is why an all-reduce costs about as much as an all-gather and a reduce-scatter together.
    """
    _check(n)
    return 2 * (n - 1) / n * nbytes


def all_to_all_bytes(nbytes: float, n: int) -> float:
    """Bytes each device sends in an all-to-all: ``(n - 1) / n * nbytes``.

    ``nbytes`` is the array one device holds (an all-to-all keeps its size). The device splits it
    into ``n`` pieces, keeps one and sends one to each of the other ``n - 1`` devices: this is the
    data that must leave the device, and what a switched or fully connected network carries. On a
    ring, pieces for distant devices are forwarded through the ones between, so each link carries
    more: about ``n / 4`` times this on a bidirectional ring, ``n / 2`` on a one-way ring. That
    growth with ``n`` is why all-to-all gets its own, better-connected axis in large meshes;
    ``all_to_all_ring_link_bytes`` gives the exact figure.
    """
    _check(n)
    return (n - 1) / n * nbytes


def all_to_all_ring_link_bytes(nbytes: float, n: int, bidirectional: bool = True) -> float:
    """Bytes each link of a ring carries in an all-to-all, both directions together.

    ``nbytes`` is the array one device holds; it sends a piece of ``nbytes / n`` to each other
    device, and each piece travels from neighbour to neighbour until it arrives. On a
    bidirectional ring it takes the shorter way round (a piece going exactly half way splits
    evenly between the two). A piece to a device ``d`` steps away crosses ``min(d, n - d)``
    links, which sum over ``d`` to ``n**2 // 4``; ``n`` devices send such pieces and the ring
    has ``n`` links, all loaded alike, so each link carries ``n**2 // 4 / n * nbytes``: about
    ``n / 4 * nbytes``, and exactly that for even ``n``. On a one-way ring a piece crosses ``d``
    links, which sum to ``n * (n - 1) / 2``, so each link carries ``(n - 1) / 2 * nbytes``: about
    ``n / 2 * nbytes``. Either way the traffic per link grows with ``n``, while the other ring
    collectives put less than ``2 * nbytes`` on a link at any ``n``.
    """
    _check(n)
    if bidirectional:
        return n * n // 4 / n * nbytes
    return (n - 1) / 2 * nbytes


def collective_permute_bytes(nbytes: float) -> float:
    """Bytes each device sends in a collective-permute: its whole buffer, once."""
    return float(nbytes)


def ring_bytes(row) -> float:
    """The formula's bytes sent per device for a row of ``book.hlo.collectives``.

    The row gives the result size on one device and the group size ``n``; the formulas above
    want the result (all-gather, all-reduce, all-to-all) or the full input (reduce-scatter,
    ``n`` times its result), so this picks the right one. A collective-permute in which every
    device sends to itself moves nothing.
    """
    n = row.group_size
    if row.op == "all-gather":
        return all_gather_bytes(row.bytes, n)
    if row.op == "reduce-scatter":
        return reduce_scatter_bytes(row.bytes * n, n)
    if row.op == "all-reduce":
        return all_reduce_bytes(row.bytes, n)
    if row.op == "all-to-all":
        return all_to_all_bytes(row.bytes, n)
    if row.op == "collective-permute":
        moves = any(source != target for source, target in row.groups)
        return collective_permute_bytes(row.bytes) if moves else 0.0
    raise ValueError(f"No ring formula for {row.op!r}.")
