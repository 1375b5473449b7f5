"""book.cost: the textbook formulas, on hand-computed values and on compiled programs."""

import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import book.cost
import book.hlo


def test_matmul_flops():
    # (2, 3) @ (3, 4): 8 outputs, each 3 multiply-adds, 2 FLOPs each.
    assert book.cost.matmul_flops(2, 3, 4) == 48
    assert book.cost.matmul_flops(2, 3, 4, batch=5) == 240


def test_ring_formulas_by_hand():
    # 800 bytes on 8 devices: pieces of 100 bytes, 7 of them move per pass.
    assert book.cost.all_gather_bytes(800, 8) == 700
    assert book.cost.reduce_scatter_bytes(800, 8) == 700
    assert book.cost.all_reduce_bytes(800, 8) == 1400
    assert book.cost.collective_permute_bytes(800) == 800
    # All-to-all of a global 6,400 bytes: each device holds 800, keeps 100 and sends 7 x 100.
    assert book.cost.all_to_all_bytes(6400, 8) == 700
    # Two devices exchange halves; one device sends nothing.
    assert book.cost.all_reduce_bytes(64, 2) == 64
    assert book.cost.all_gather_bytes(64, 1) == 0


def _routed_link_load(nbytes, n, bidirectional):
    # Route every piece of an all-to-all of a global array of nbytes hop by hop, and count what
    # each link carries: each device holds nbytes / n and sends nbytes / n**2 to each other one.
    load = [0.0] * n  # link i joins devices i and i + 1 (mod n), both directions together
    piece = nbytes / n / n
    for source in range(n):
        for d in range(1, n):
            if not bidirectional or d < n - d:
                ways = [(+1, d, 1.0)]
            elif d > n - d:
                ways = [(-1, n - d, 1.0)]
            else:  # exactly half way round: half the piece each way
                ways = [(+1, d, 0.5), (-1, d, 0.5)]
            for step, hops, share in ways:
                at = source
                for _ in range(hops):
                    load[at if step == +1 else (at - 1) % n] += share * piece
                    at = (at + step) % n
    return load


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 16])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_all_to_all_ring_link_bytes_match_routing_every_piece(n, bidirectional):
    load = _routed_link_load(6400.0, n, bidirectional)
    expected = book.cost.all_to_all_ring_link_bytes(6400.0, n, bidirectional=bidirectional)
    assert load == pytest.approx([expected] * n)


def test_all_to_all_is_a_quarter_of_an_all_gather_of_the_same_array():
    # The same global array S on a bidirectional ring: each link carries S / 4 in an
    # all-to-all (even n) and (n - 1) / n * S in an all-gather, so the ratio is n / (4 (n - 1)).
    s = 6400
    assert book.cost.all_to_all_ring_link_bytes(s, 8) == s / 4 == 1600
    assert book.cost.all_to_all_ring_link_bytes(s, 8, bidirectional=False) == 7 / 16 * s
    assert book.cost.all_to_all_ring_link_bytes(s, 1) == 0
    for n in (2, 8, 16, 64, 256):
        ratio = book.cost.all_to_all_ring_link_bytes(s, n) / book.cost.all_gather_bytes(s, n)
        assert ratio == pytest.approx(n / (4 * (n - 1)))
        one_way = book.cost.all_to_all_ring_link_bytes(s, n, bidirectional=False)
        assert one_way == pytest.approx(book.cost.all_gather_bytes(s, n) / 2)
    assert ratio == pytest.approx(0.25, rel=0.01)  # n = 256
    # What leaves each device stays below what each link carries: a ring forwards pieces.
    for n in (4, 8, 64):
        assert book.cost.all_to_all_bytes(s, n) < book.cost.all_to_all_ring_link_bytes(s, n)


def test_ring_steps_and_the_alpha_beta_time():
    assert book.cost.ring_steps("all-gather", 8) == 7
    assert book.cost.ring_steps("reduce-scatter", 8) == 7
    assert book.cost.ring_steps("all-to-all", 8) == 7
    assert book.cost.ring_steps("all-reduce", 8) == 14
    assert book.cost.ring_steps("collective-permute", 8) == 1
    assert book.cost.ring_steps("all-reduce", 1) == 0
    with pytest.raises(ValueError, match="No ring schedule"):
        book.cost.ring_steps("broadcast", 8)
    # 1,400 bytes at 100 bytes/s take 14 s; 14 steps of 1 s add 14 s more.
    assert book.cost.collective_seconds(1400, 14, bandwidth=100, hop_latency=1) == 28
    assert book.cost.collective_seconds(1400, 0, bandwidth=100, hop_latency=1) == 14
    with pytest.raises(ValueError, match="bandwidth must be more than 0"):
        book.cost.collective_seconds(1400, 14, bandwidth=0, hop_latency=1)
    for bandwidth, latency in ((5e-324, 1e-6), (450e9, 1e308)):  # no time a float holds
        with pytest.raises(ValueError, match="longer than a float holds"):
            book.cost.collective_seconds(1400, 14, bandwidth=bandwidth, hop_latency=latency)


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_a_ring_needs_a_positive_whole_number(n):
    with pytest.raises(ValueError, match="positive whole number"):
        book.cost.all_gather_bytes(8, n)


def test_a_byte_count_past_any_machine_is_refused_not_overflowed():
    for formula in (book.cost.all_reduce_bytes, book.cost.all_to_all_ring_link_bytes):
        with pytest.raises(ValueError, match="too large"):
            formula(sys.float_info.max, 8)
    assert book.cost.all_reduce_bytes(1e30, 2) == 1e30


def test_ring_bytes_of_compiled_collectives():
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    x = jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P("x", None)))

    (reduce,) = book.hlo.collectives(jax.jit(lambda x: x.sum(0)).lower(x).compile())
    assert reduce.bytes == 32
    assert book.cost.ring_bytes(reduce) == 2 * 7 / 8 * 32 == 56

    replicated = NamedSharding(mesh, P())
    lowered = jax.jit(lambda x: x, out_shardings=replicated).lower(x)
    (gather,) = book.hlo.collectives(lowered.compile())
    assert book.cost.ring_bytes(gather) == 7 / 8 * 512 == 448

    scatter = jax.shard_map(
        lambda y: jax.lax.psum_scatter(y, "x", tiled=True),
        mesh=mesh,
        in_specs=P(),
        out_specs=P("x"),
    )
    (rs,) = book.hlo.collectives(jax.jit(scatter).lower(jnp.ones((16, 8))).compile())
    # The row holds the scattered piece (64 bytes); the formula wants the full input (512).
    assert book.cost.ring_bytes(rs) == 7 / 8 * 512

    ring = [(i, (i + 1) % 8) for i in range(8)]
    shift = jax.shard_map(
        lambda y: jax.lax.ppermute(y, "x", ring), mesh=mesh, in_specs=P("x"), out_specs=P("x")
    )
    (permute,) = book.hlo.collectives(jax.jit(shift).lower(x).compile())
    assert book.cost.ring_bytes(permute) == 64


def test_a_permute_onto_itself_moves_nothing():
    row = book.hlo.Collective("collective-permute", ((4,),), "float32", 16, ((0, 0), (1, 1)))
    assert book.cost.ring_bytes(row) == 0


def test_a_negative_zero_of_bytes_is_zero():
    for formula in (book.cost.all_gather_bytes, book.cost.all_reduce_bytes):
        assert str(formula(-0.0, 8)) == "0.0"
