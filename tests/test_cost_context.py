"""book.cost's context-parallel formulas: by hand, against each other, and on compiled programs."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import book.cost
import book.hlo
from book.errors import ReaderError


def test_the_section_sizes_by_hand():
    # 64 tokens, 8 heads of 8, float32: K and V are 2 x 64 x 8 x 8 x 4 = 32,768 bytes, and the
    # ring sends 7/8 of them. Ulysses moves Q, K, V and the output, 4 x 16,384 bytes, of which
    # each device holds an eighth and sends 7/8 of that.
    assert book.cost.ring_attention_bytes(64, 8, 8, 8) == 28_672
    assert book.cost.ulysses_bytes(64, 8, 8, 8, 8) == 7_168
    assert book.cost.ring_attention_bytes(64, 8, 8, 8, backward=True) == 57_344
    assert book.cost.ulysses_bytes(64, 8, 8, 8, 8, backward=True) == 14_336
    assert book.cost.ulysses_bytes(64, 8, 8, 8, 8, itemsize=2) == 3_584  # bfloat16
    assert book.cost.ring_attention_bytes(64, 8, 8, 1) == book.cost.ulysses_bytes(64, 8, 8, 8, 1)


def test_the_ring_sends_an_all_gather_of_k_and_v():
    for n in (2, 4, 8, 16):
        kv_bytes = 2 * 4096 * 4 * 64 * 2
        assert book.cost.ring_attention_bytes(4096, 4, 64, n, itemsize=2) == (
            book.cost.all_gather_bytes(kv_bytes, n)
        )


@pytest.mark.parametrize("heads,kv_heads", [(8, 8), (32, 8), (64, 8), (16, 16)])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_over_ulysses_is_n_kv_heads_over_all_heads(heads, kv_heads, n):
    # Ring: 2 kv (n - 1)/n; Ulysses: (2 heads + 2 kv)(n - 1)/n**2, per token and head_dim.
    ring = book.cost.ring_attention_bytes(1024, kv_heads, 64, n)
    ulysses = book.cost.ulysses_bytes(1024, heads, kv_heads, 64, n)
    assert ring / ulysses == pytest.approx(n * kv_heads / (heads + kv_heads))
    if heads == kv_heads:
        assert ring / ulysses == pytest.approx(n / 2)


def test_with_fixed_tokens_per_device_ulysses_stays_flat_and_the_ring_grows():
    per_device = 2048
    ring = [book.cost.ring_attention_bytes(per_device * n, 8, 64, n) for n in (2, 4, 8)]
    ulysses = [book.cost.ulysses_bytes(per_device * n, 8, 8, 64, n) for n in (2, 4, 8)]
    one_block = 2 * per_device * 8 * 64 * 4  # one device's K and V
    assert ring == [(n - 1) * one_block for n in (2, 4, 8)]
    assert ulysses == [(n - 1) / n * 2 * one_block for n in (2, 4, 8)]  # Q, K, V, output
    assert max(ulysses) < 2 * one_block


@pytest.mark.parametrize(
    "call,words",
    [
        (lambda: book.cost.ulysses_bytes(1024, 64, 8, 128, 16), "do not split over 16"),
        (lambda: book.cost.ulysses_bytes(1024, 12, 8, 128, 4), "multiple of kv_heads"),
        (lambda: book.cost.ring_attention_bytes(1000, 8, 128, 16), "multiple of 16"),
        (lambda: book.cost.ulysses_bytes(100, 8, 8, 128, 8), "multiple of 8"),
        (lambda: book.cost.ring_attention_bytes(64, 8, 8, 8, backward="False"), "True or"),
        (lambda: book.cost.ring_attention_bytes(64, 8, 8, 8, itemsize=0), "itemsize"),
        (lambda: book.cost.ring_attention_bytes(64, 0, 8, 8), "kv_heads"),
        (lambda: book.cost.ulysses_bytes(64, 8.5, 8, 8, 8), "heads"),
        (lambda: book.cost.ulysses_bytes(math.nan, 8, 8, 8, 8), "tokens"),
        (lambda: book.cost.ring_attention_bytes(-64, 8, 8, 8), "tokens"),
        (lambda: book.cost.ring_attention_bytes("64", 8, 8, 8), "tokens"),
        (lambda: book.cost.ring_attention_bytes(64, 8, None, 8), "head_dim"),
        (lambda: book.cost.ulysses_bytes(64, 8, 8, 8, 0), "devices"),
    ],
)
def test_what_cannot_be_laid_out_is_refused_in_one_sentence(call, words):
    with pytest.raises(ReaderError) as caught:
        call()
    message = str(caught.value)
    assert words in message
    assert "\n" not in message and message.endswith(".") and len(message) < 300


# The formulas against what XLA compiles: a GQA layer's collectives, without the attention.

N, TOKENS, HEADS, KV_HEADS, DIM = 8, 64, 16, 8, 4


def _sent(compiled):
    return sum(book.cost.ring_bytes(r) for r in book.hlo.collectives(compiled))


def _compiled(layer):
    """``layer`` over a sequence axis of 8 devices, forward, and forward with backward."""
    mesh = jax.make_mesh((N,), ("seq",), axis_types=(AxisType.Explicit,))
    spec = P(None, "seq")
    sharded = jax.shard_map(layer, mesh=mesh, in_specs=spec, out_specs=spec)
    rng = np.random.default_rng(0)

    def put(heads):
        data = rng.standard_normal((heads, TOKENS, DIM), dtype=np.float32)
        return jax.device_put(data, NamedSharding(mesh, spec))

    q, k, v, dout = put(HEADS), put(KV_HEADS), put(KV_HEADS), put(HEADS)

    def both(q, k, v, dout):
        out, pullback = jax.vjp(sharded, q, k, v)
        return out, *pullback(dout)

    return jax.jit(sharded).lower(q, k, v).compile(), jax.jit(both).lower(q, k, v, dout).compile()


def _mix(q, k, v):
    # A stand-in for attention that uses every input: query heads share their K/V head.
    return q * jnp.repeat(k * v, HEADS // KV_HEADS, axis=0).sum(1, keepdims=True)


def test_ulysses_bytes_equal_a_compiled_gqa_layer():
    def layer(q, k, v):
        q, k, v = (jax.lax.all_to_all(a, "seq", 0, 1, tiled=True) for a in (q, k, v))
        return jax.lax.all_to_all(_mix(q, k, v), "seq", 1, 0, tiled=True)

    forward, both = _compiled(layer)
    assert _sent(forward) == book.cost.ulysses_bytes(TOKENS, HEADS, KV_HEADS, DIM, N)
    assert _sent(both) == book.cost.ulysses_bytes(TOKENS, HEADS, KV_HEADS, DIM, N, backward=True)


def test_ring_attention_bytes_equal_a_compiled_gqa_ring():
    def layer(q, k, v):
        right = [(j, (j + 1) % N) for j in range(N)]
        out = _mix(q, k, v)
        for _ in range(N - 1):  # unrolled: every collective-permute is listed
            k, v = jax.lax.ppermute((k, v), "seq", right)
            out = out + _mix(q, k, v)
        return out

    forward, both = _compiled(layer)
    assert {r.op for r in book.hlo.collectives(forward)} == {"collective-permute"}
    assert _sent(forward) == book.cost.ring_attention_bytes(TOKENS, KV_HEADS, DIM, N)
    assert _sent(both) == book.cost.ring_attention_bytes(TOKENS, KV_HEADS, DIM, N, backward=True)
