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
    """A size in bytes: a number from 0 to 1e30 (a float, as averages and shares are).

    No machine holds more; the bound keeps what the formulas make of it a finite float.
    """
    checked = validate.number(
        value, name, high=1e30, wanted="a number of bytes such as 1024", error=validate.BadValue
    )
    return checked + 0.0  # -0.0 is 0 bytes, not a negative zero in a table


def _size(value, name: str) -> int:
    return validate.whole(value, name, low=0, high=MAX_COUNT, error=validate.BadValue)


@validate.impostors_refused
def matmul_flops(m: int, k: int, n: int, batch: int = 1) -> int:
    """FLOPs of an ``(m, k) @ (k, n)`` product: ``2 * m * k * n``.

    Each of the ``m * n`` outputs is a dot product of length ``k``: ``k`` multiplies and
    ``k - 1`` adds, which the convention (and XLA's ``cost_analysis``) rounds to one multiply
    and one add per multiply-accumulate.
    """
    m, k, n = _size(m, "m"), _size(k, "k"), _size(n, "n")
    return 2 * _size(batch, "batch") * m * k * n


@validate.impostors_refused
def all_gather_bytes(result_bytes: float, n: int) -> float:
    """Bytes each device sends in an all-gather on a ring: ``(n - 1) / n * result_bytes``.

    Every device starts with ``1/n`` of the result and must receive the other ``n - 1`` pieces.
    On a ring each step forwards one piece to the next neighbour, so after ``n - 1`` steps every
    device has sent (and received) ``n - 1`` pieces of ``result_bytes / n``.
    """
    n, result_bytes = _check(n), _bytes(result_bytes)
    return (n - 1) / n * result_bytes


@validate.impostors_refused
def reduce_scatter_bytes(input_bytes: float, n: int) -> float:
    """Bytes each device sends in a reduce-scatter on a ring: ``(n - 1) / n * input_bytes``.

    ``input_bytes`` is the full-size array each device holds before the reduction (``n`` times
    the scattered result). The ring passes partial sums: at each of ``n - 1`` steps a device adds
    its own piece to the partial sum it received and forwards one piece of ``input_bytes / n``.
    It is an all-gather run backwards, so it costs the same.
    """
    n, input_bytes = _check(n), _bytes(input_bytes)
    return (n - 1) / n * input_bytes


@validate.impostors_refused
def all_reduce_bytes(nbytes: float, n: int) -> float:
    """Bytes each device sends in an all-reduce on a ring: ``2 * (n - 1) / n * nbytes``.

    The bandwidth-optimal all-reduce is a reduce-scatter (each device ends with the full sum of
    one ``1/n`` piece) followed by an all-gather of those pieces: twice ``(n - 1) / n * nbytes``.
    This is why an all-reduce costs about as much as an all-gather and a reduce-scatter together.
    """
    n, nbytes = _check(n), _bytes(nbytes)
    return 2 * (n - 1) / n * nbytes


@validate.impostors_refused
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


@validate.impostors_refused
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


@validate.impostors_refused
def collective_permute_bytes(nbytes: float) -> float:
    """Bytes each device sends in a collective-permute: its whole buffer, once."""
    return _bytes(nbytes)


@validate.impostors_refused
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


@validate.impostors_refused
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


@validate.impostors_refused
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
    seconds = steps * hop_latency + link_bytes / bandwidth
    if seconds == float("inf"):  # a bandwidth of 5e-324 or a latency of 1e308: no link
        raise validate.BadValue(
            f"A collective over this link takes longer than a float holds (bandwidth "
            f"{validate.describe(bandwidth)}, hop_latency {validate.describe(hop_latency)}); "
            "give bytes per second such as 450e9 and seconds such as 1e-6."
        )
    return seconds


# Attention with its sequence split over n devices -------------------------------------------


def _attention_sizes(tokens, kv_heads, head_dim, n, itemsize) -> tuple[int, int, int, int, int]:
    """The checked sizes of one attention layer; the tokens must split evenly over ``n``."""
    n = _check(n)
    tokens = validate.whole(tokens, "tokens", high=MAX_COUNT, error=validate.BadValue)
    kv_heads = validate.whole(kv_heads, "kv_heads", error=validate.BadValue)
    head_dim = validate.whole(head_dim, "head_dim", error=validate.BadValue)
    itemsize = validate.whole(itemsize, "itemsize", high=16, example=2, error=validate.BadValue)
    if tokens % n:
        raise validate.BadValue(
            f"{tokens:,} tokens do not split evenly over {n} devices; use a multiple of {n}."
        )
    return tokens, kv_heads, head_dim, n, itemsize


def _passes(backward) -> int:
    # Every collective's transpose moves as many bytes as the collective.
    return 2 if validate.flag(backward, "backward", error=validate.BadValue) else 1


@validate.impostors_refused
def ring_attention_bytes(
    tokens: int, kv_heads: int, head_dim: int, n: int, itemsize: int = 4, backward: bool = False
) -> float:
    """Bytes each device sends for one attention layer under ring attention on ``n`` devices.

    ``tokens`` is the whole sequence (times the batch). At each of the ``n - 1`` steps a device
    passes the K and V blocks it holds, ``tokens / n`` positions of ``kv_heads`` heads, to its
    neighbour, so every device receives every other device's K and V once: the bytes of
    ``all_gather_bytes`` of K and V, which is also what gathering them outright sends. Queries
    never travel, so only the K/V heads count, fewer than the query heads under grouped-query
    attention. The causal mask changes the work, not the bytes: every block travels.

    With ``backward``, the backward pass is added. JAX transposes each ``ppermute`` into one
    the other way round that carries the gradients of K and V, the same bytes again (as it
    transposes an all-gather into a reduce-scatter of the same size). A ring with a hand-written
    backward that passes K and V around again beside their gradients, to keep less in memory,
    sends about twice the forward's bytes in its backward pass; this formula does not count it.
    """
    tokens, kv_heads, head_dim, n, itemsize = _attention_sizes(
        tokens, kv_heads, head_dim, n, itemsize
    )
    kv_bytes = 2 * tokens * kv_heads * head_dim * itemsize  # K and V of the whole sequence
    kv_bytes = _bytes(kv_bytes, "K and V of these tokens, heads and head_dim, in bytes,")
    return _passes(backward) * all_gather_bytes(kv_bytes, n)


@validate.impostors_refused
def ulysses_bytes(
    tokens: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    n: int,
    itemsize: int = 4,
    backward: bool = False,
) -> float:
    """Bytes each device sends for one attention layer under Ulysses on ``n`` devices.

    Ulysses (DeepSpeed-Ulysses) trades the sequence split for a head split: all-to-alls take Q,
    K and V from ``tokens / n`` positions of every head to every position of ``1 / n`` of the
    heads, attention runs on whole sequences, and one more all-to-all brings the output back.
    That is ``all_to_all_bytes`` of four arrays: Q and the output with ``heads`` heads, K and V
    with ``kv_heads``. A device sends a fixed share of its own tokens' Q, K, V and output, so for
    a fixed number of tokens per device its bytes hardly change with ``n``, where the ring's grow
    with the whole sequence.

    As MaxText implements it, each device needs whole K/V heads (and the query heads that
    share them), so ``n`` must divide ``kv_heads``, and ``kv_heads`` must divide ``heads``;
    anything else is refused. Implementations that repeat K/V heads on more devices, up to the
    number of query heads and for more bytes, or split heads unevenly, are not modelled. With
    ``backward``, the backward pass is added: JAX transposes each all-to-all into one with the
    split and concatenated axes swapped, the same bytes again.
    """
    tokens, kv_heads, head_dim, n, itemsize = _attention_sizes(
        tokens, kv_heads, head_dim, n, itemsize
    )
    heads = validate.whole(heads, "heads", error=validate.BadValue)
    if heads % kv_heads:
        raise validate.BadValue(
            f"{heads} query heads do not share {kv_heads} K/V heads evenly; "
            "heads must be a multiple of kv_heads."
        )
    if kv_heads % n:
        raise validate.BadValue(
            f"Ulysses as MaxText implements it gives each device whole K/V heads, and "
            f"{kv_heads} K/V heads do not split over {n} devices; use a number of devices that "
            f"divides {kv_heads}, or a ring."
        )
    q_bytes = tokens * heads * head_dim * itemsize  # Q, and the output of the same shape
    kv_bytes = 2 * tokens * kv_heads * head_dim * itemsize
    moved = _bytes(2 * q_bytes + kv_bytes, "Q, K, V and the output of these sizes, in bytes,")
    return _passes(backward) * all_to_all_bytes(moved, n)
