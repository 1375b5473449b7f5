"""The product check of chapter 06 passes the right bidirectional variants and fails wrong ones.

The bidirectional rings are easy to get subtly wrong: each half-block travels its own way,
so the half of A it meets must be indexed by where that half came from. Mis-indexed versions
here differ from the right ones by one index expression each, as a slip would.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from book import checks

M, K, N = 64, 128, 32
LEFT = [(j, (j - 1) % 8) for j in range(8)]
RIGHT = [(j, (j + 1) % 8) for j in range(8)]


@pytest.fixture(scope="module")
def problem():
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
    rng = np.random.default_rng(1)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    return mesh, a, b


def gather_ring(bottom_source):
    """The bidirectional all-gather ring; ``bottom_source(me, step)`` indexes the lower halves."""

    def matmul(a_blk, b_blk):
        n, me = jax.lax.axis_size("x"), jax.lax.axis_index("x")
        k = b_blk.shape[0]
        h = k // 2
        top, bottom = b_blk[:h], b_blk[h:]
        out = jnp.zeros((a_blk.shape[0], b_blk.shape[1]), a_blk.dtype)
        for step in range(n):
            if step < n - 1:
                top_next = jax.lax.ppermute(top, "x", LEFT)
                bottom_next = jax.lax.ppermute(bottom, "x", RIGHT)
            t, b = (me + step) % n, bottom_source(me, step) % n
            out += jax.lax.dynamic_slice_in_dim(a_blk, t * k, h, axis=1) @ top
            out += jax.lax.dynamic_slice_in_dim(a_blk, b * k + h, h, axis=1) @ bottom
            if step < n - 1:
                top, bottom = top_next, bottom_next
        return out

    return matmul


def scatter_ring(bottom_block):
    """The bidirectional reduce-scatter ring; ``bottom_block(me, step)`` picks lower halves."""

    def matmul(a_blk, b_blk):
        n, me = jax.lax.axis_size("x"), jax.lax.axis_index("x")
        m = a_blk.shape[0] // n
        h = m // 2

        def partial(block, half):
            rows = block * m + half * h
            return jax.lax.dynamic_slice_in_dim(a_blk, rows, h, axis=0) @ b_blk

        top, bottom = partial((me + 1) % n, 0), partial(bottom_block(me, 0) % n, 1)
        for step in range(1, n):
            top = jax.lax.ppermute(top, "x", LEFT) + partial((me + step + 1) % n, 0)
            bottom = jax.lax.ppermute(bottom, "x", RIGHT) + partial(bottom_block(me, step) % n, 1)
        return jnp.concatenate([top, bottom], axis=0)

    return matmul


def run(mesh, variant, a, b, a_spec):
    a_x = jax.device_put(a, NamedSharding(mesh, a_spec))
    b_x = jax.device_put(b, NamedSharding(mesh, P("x", None)))
    f = jax.shard_map(variant, mesh=mesh, in_specs=(a_spec, P("x", None)), out_specs=P("x"))
    return jax.jit(f)(a_x, b_x)


def test_right_bidirectional_gather_ring_passes(problem):
    mesh, a, b = problem
    out = run(mesh, gather_ring(lambda me, step: me - step), a, b, P("x", None))
    assert checks.assert_product(out, a, b, row_blocks=8) < checks.tolerance(K)


@pytest.mark.parametrize(
    "slip",
    [
        lambda me, step: me + step,  # the lower halves indexed as if they went left too
        lambda me, step: me - step - 1,  # one step behind
    ],
)
def test_mis_indexed_gather_ring_fails(problem, slip):
    mesh, a, b = problem
    out = run(mesh, gather_ring(slip), a, b, P("x", None))
    with pytest.raises(AssertionError, match="differs from A @ B"):
        checks.assert_product(out, a, b, row_blocks=8)


def test_right_bidirectional_scatter_ring_passes(problem):
    mesh, a, b = problem
    out = run(mesh, scatter_ring(lambda me, step: me - step - 1), a, b, P(None, "x"))
    assert checks.assert_product(out, a, b, row_blocks=8) < checks.tolerance(K)


def test_mis_indexed_scatter_ring_fails_and_names_the_blocks(problem):
    mesh, a, b = problem
    out = run(mesh, scatter_ring(lambda me, step: me + step + 1), a, b, P(None, "x"))
    with pytest.raises(AssertionError, match=r"row blocks \[0, 1, 2, 3, 4, 5, 6, 7\] of 8"):
        checks.assert_product(out, a, b, row_blocks=8)


def test_rounding_passes_and_a_small_real_error_does_not():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((16, 1024), dtype=np.float32)
    b = rng.standard_normal((1024, 8), dtype=np.float32)
    reordered = sum(a[:, k::8] @ b[k::8] for k in range(8))  # float32, another order
    assert 0 < checks.assert_product(reordered, a, b) < checks.tolerance(1024)
    wrong = reordered.copy()
    wrong[5, 3] += 0.01 * np.abs(a[5]) @ np.abs(b[:, 3])
    with pytest.raises(AssertionError, match="row 5 column 3"):
        checks.assert_product(wrong, a, b)


def test_tolerance_grows_with_the_length_of_the_sums():
    assert checks.tolerance(4) == checks.RTOL
    assert checks.tolerance(512) < checks.tolerance(8192) < 1e-3


def test_wrong_shape_is_explained():
    with pytest.raises(AssertionError, match=r"has shape \(2, 2\), but A @ B has shape"):
        checks.assert_product(np.zeros((2, 2)), np.ones((2, 3)), np.ones((3, 4)))
