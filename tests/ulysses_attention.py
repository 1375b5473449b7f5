"""Ulysses context parallelism for chapter 13's block: a drop-in for transformer.attention."""

import contextlib

import jax
import jax.numpy as jnp

from book.lessons import transformer as T

ORIG = (T.attention, T.block, T.forward, T.loss_fn)  # chapter 13's, before any patch
AXIS = "context"  # the mesh axis the sequence is split over
CP_RULES = {"seq": AXIS}  # the residual stream split by sequence over "context"


def ulysses_attention(x, p, cfg, layout):
    """Chapter 13's attention with Ulysses over "context" (DeepSpeed-Ulysses).

    x arrives split by sequence over "context". Q, K and V come from a projection with
    replicated weights, still sequence-split; one all-to-all (Q, K and V together, laid out by
    K/V head as chapter 13's wqkv is) trades the sequence split for a split of the K/V head
    groups, causal attention runs on whole sequences for those heads, and a second all-to-all
    brings the context back to the sequence split before the output projection wo.
    With TP the heads are split over "model" as well; "context" then splits each device's
    K/V heads further, so context must divide kv_heads / tp.
    """
    names = ("batch", "seq", "heads", None, None)
    qkv = T.constrain(jnp.einsum("bsd,dkjh->bskjh", x, p["wqkv"]), names, layout)
    spec = T.logical_spec(names, layout.rules)
    group = cfg.n_heads // cfg.n_kv_heads

    def local(qkv):
        qkv = jax.lax.all_to_all(qkv, AXIS, 2, 1, tiled=True)  # split K/V heads, whole seq
        q, k, v = qkv[:, :, :, :group], qkv[:, :, :, group], qkv[:, :, :, group + 1]
        scores = jnp.einsum("bqkgh,bskh->bkgqs", q, k) * cfg.d_head**-0.5
        seq = q.shape[1]
        causal = jnp.tril(jnp.ones((seq, seq), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        context = jnp.einsum("bkgqs,bskh->bqkgh", weights, v)
        return jax.lax.all_to_all(context, AXIS, 1, 2, tiled=True)  # back to seq split

    context = jax.shard_map(local, mesh=layout.mesh, in_specs=spec, out_specs=spec)(qkv)
    return jnp.einsum("bqkgh,kghd->bqd", context, p["wo"])


def block(x, p, cfg, layout):
    """Chapter 13's block with Ulysses attention, its MLP's hidden units split by sequence.

    Chapter 13 pins the hidden units to ("batch", None, "mlp"): the sequence whole, as
    sequence parallelism wants it there. Under a "seq" rule that constraint all-gathers the
    hidden units over "context" (forward and recomputation) and the stream's gradient in the
    backward pass; here the sequence stays split, ("batch", "seq", "mlp").
    """
    attn = ulysses_attention(T.rms_norm(x, p["attn_norm"]), p, cfg, layout)
    x = x + T.checkpoint_name(T.constrain(attn, T.STREAM, layout), "attn_out")
    h = jax.nn.gelu(jnp.einsum("bsd,df->bsf", T.rms_norm(x, p["mlp_norm"]), p["w_in"]))
    h = T.constrain(h, ("batch", "seq", "mlp"), layout)
    mlp = jnp.einsum("bsf,fd->bsd", h, p["w_out"])
    return x + T.checkpoint_name(T.constrain(mlp, T.STREAM, layout), "mlp_out")


def forward(params, tokens, cfg, layout=None, policy=None):
    """Chapter 13's forward with the logits split by sequence, ("batch", "seq", "vocab").

    Chapter 13 pins the logits to ("batch", None, "vocab"), which under a "seq" rule gathers
    the final stream over "context" and computes every position's logits on every device.
    """
    x = T.constrain(params["embed"][tokens], T.STREAM, layout)
    x = T.run_blocks(x, params["blocks"], cfg, layout, policy)
    x = T.rms_norm(x, params["final_norm"])
    logits = jnp.einsum("bsd,dv->bsv", x, params["unembed"])
    return T.constrain(logits, ("batch", "seq", "vocab"), layout)


def loss_fn(params, tokens, targets, cfg, layout=None, policy=None):
    """Chapter 13's loss with the targets split by sequence, as the logits are.

    make_step lays the targets out by ("batch", None); the one-hot of the targets, which the
    backward pass keeps, would be whole over "context" on every device.
    """
    targets = T.constrain(targets, ("batch", "seq"), layout)
    return ORIG[3](params, tokens, targets, cfg, layout, policy)


@contextlib.contextmanager
def patched(whole=True):
    """Chapter 13's module with Ulysses attention; with ``whole``, also this module's block,
    forward and loss, which keep the sequence split over "context" throughout."""
    saved = T.attention, T.block, T.forward, T.loss_fn
    T.attention = ulysses_attention
    if whole:
        T.block, T.forward, T.loss_fn = block, forward, loss_fn
    try:
        yield
    finally:
        T.attention, T.block, T.forward, T.loss_fn = saved
