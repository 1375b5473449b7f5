"""Checkers for chapters 7 to 10: training steps written with shard_map, and the sharded
loader, checked against one device."""

from __future__ import annotations

import numpy as np

from book import validate
from book.exercises.core import (
    Wrong,
    answered,
    checker,
    compile_and_run,
    fresh_source,
    function,
    ints,
    line_mesh,
    need,
    numbers,
    pair,
    recording,
    scratch_folder,
    spec_text,
)

# Chapters 07 to 09: training steps written with shard_map, checked against one device -----


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


def _row_shapes(row) -> list[tuple]:
    """The shapes a collective moves: several when the compiler combined collectives."""
    return list(row.shapes)


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
    shape = tuple(np.shape(want))
    dtype = getattr(got, "dtype", None)  # before widening: a 16-bit answer is too coarse
    try:
        values = validate.widened(np.asarray(got))
    except Exception:  # noqa: BLE001 - a ragged or self-holding list
        values = None
    if values is None or values.dtype.kind not in "biuf":  # strings, objects, complex numbers
        complex_ = values is not None and values.dtype.kind == "c"
        given = "holds complex numbers" if complex_ else f"is {validate.describe(got)}"
        raise Wrong(
            f"{label} {given}; it should be an array of real numbers of shape {shape}, as on "
            "one device."
        )
    got = values.astype(np.float64)
    need(
        got.shape == shape,
        f"{label} has shape {got.shape}; it should be {shape}, as on one device.",
    )
    need(
        np.isfinite(got).all(),
        f"{label} holds nan or infinite values; one device's is finite, so look for a "
        "division by zero or a log of zero.",
    )
    if _near(got, want):
        return
    for value, why in known:
        need(not _near(got, value), f"{label} differs from one device's: {why}.")
    factor = _factor(got, want)
    for value, why in (factors or {}).items():
        need(
            not np.isclose(factor, value, rtol=1e-3),
            f"{label} is {value:g} times one device's: {why}.",
        )
    worst = float(np.max(np.abs(np.asarray(got, np.float64) - want)))
    scale = float(np.max(np.abs(want), initial=0.0))
    need(
        getattr(dtype, "itemsize", 8) > 2 or worst > 1e-2 * scale,
        f"{label} is {dtype}, too coarse to compare with one device's float32; return it in "
        "float32.",
    )
    raise Wrong(f"{label} differs from one device's by up to {worst:.3g}.")


def _loss_and_grads(
    out, what, ref_loss, ref_grads, loss_factors=None, grad_factors=None, known_losses=()
):
    """The reader's ``(loss, grads)`` against the reference: the loss, then each gradient."""
    loss, grads = pair(out, what, "(loss, grads)")
    need(
        not (isinstance(loss, dict) and set(loss) == set(ref_grads)),
        f"{what} returns (grads, loss); return them in the other order, (loss, grads), as "
        "jax.value_and_grad does.",
    )
    need(
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
    need(
        sharding is not None and sharding.is_equivalent_to(NamedSharding(mesh, spec), arr.ndim),
        f"{label} comes out as {spec_text(getattr(sharding, 'spec', ()))}; return it as "
        f"{spec_text(spec)}.",
    )


def _batch_stays(rows, weights=()):
    """No collective may gather anything but the whole weights: the batch stays split."""
    for r in rows:
        for shape in _row_shapes(r) if r.op == "all-gather" else ():
            need(
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
    need(ops == ["all-reduce"], f"Expected only all-reduces, but the program has {ops}.")
    need(
        sent <= most,
        f"The program all-reduces {sent:,} bytes per device, more than the {what}; sum each "
        "of them once.",
    )
    return sent


@checker
def ch07_sum_dp(sum_dp_grads):
    """Exercise 7.1: data parallelism when each device's loss is a sum over its examples.

    A fresh problem of 96 examples, 12 per device, so that the usual mistakes give different
    factors: a ``pmean`` of the sums (12, the examples per device), a ``psum`` not divided (96,
    the batch), a division by one device's examples or a double sum (8, the devices).
    """
    from jax.sharding import PartitionSpec as P

    import book.hlo
    from book import models

    mesh = line_mesh("data")
    sizes = models.Sizes(batch=96, features=24, hidden=40, classes=8)
    params, x, y = _problem(701, sizes)
    ref_loss, ref_grads = _one_device(models.loss, params, x, y)
    args = _put(mesh, params, P()), _put(mesh, x, P("data")), _put(mesh, y, P("data"))
    out, compiled = compile_and_run(sum_dp_grads, *args)
    answered(out, "sum_dp_grads returns nothing yet; return (loss, grads)")
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


@checker
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

    mesh = line_mesh("data")
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
    out, compiled = compile_and_run(masked_dp_grads, *args)
    answered(out, "masked_dp_grads returns nothing yet; return (loss, grads)")
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
    import jax
    from jax.sharding import PartitionSpec as P

    import book.hlo
    from book import models

    mesh = line_mesh("data")
    sizes = models.Sizes(batch=96, features=24, hidden=40, classes=16)
    params, x, y = _problem(seed, sizes)
    args = _put(mesh, params, specs), _put(mesh, x, P("data")), _put(mesh, y, P("data"))
    gathered = []

    def recording_gathers(real):
        def all_gather(x, *a, **kw):
            out = real(x, *a, **kw)
            gathered.append(tuple(out.shape))
            return out

        return all_gather

    full = {tuple(v.shape): k for k, v in params.items()}
    try:
        with recording(jax.lax, "all_gather", recording_gathers):
            out, compiled = compile_and_run(fn, *args)
    except (TypeError, ValueError):
        odd = [shape for shape in gathered if shape not in full]
        if not odd:
            raise
        raise Wrong(
            f"An all_gather made a {odd[0]} array, the shape of no parameter "
            f"({', '.join(f'{k} {v}' for v, k in full.items())}); gather each sharded "
            "parameter along the dimension its spec splits, with tiled=True, and leave a "
            "replicated one as it is."
        ) from None
    answered(out, f"{what} returns nothing yet; return (loss, grads)")
    ref_loss, ref_grads = _one_device(models.loss, params, x, y)
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
        need(
            params[name].shape in gathered,
            f"{name} is never gathered whole: FSDP gathers each weight where it is used, "
            "while the batch stays split.",
        )
    whole = sum(params[k].nbytes for k in params if k not in sharded)
    reduced = sum(r.bytes for r in rows if r.op == "all-reduce")
    need(
        reduced <= whole + 8,
        f"The program all-reduces {reduced:,} bytes per device: whole gradients of sharded "
        "weights, summed everywhere and then cut to a shard; differentiate through the "
        "all_gather, and its transpose delivers each device only its shard.",
    )
    scattered = sum(r.bytes for r in rows if r.op == "reduce-scatter")
    shard_bytes = sum(params[k].nbytes for k in sharded) // 8
    need(
        scattered == shard_bytes,
        f"The gradients of the sharded weights should come back by reduce-scatter, "
        f"{shard_bytes:,} bytes per device, but the program reduce-scatters {scattered:,}.",
    )
    return scattered, reduced


def _fsdp_specs(matrices, biases):
    from jax.sharding import PartitionSpec as P

    return {"w1": P(*matrices), "b1": P(*biases), "w2": P(*matrices), "b2": P(*biases)}


@checker
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


@checker
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


@checker
def ch09_two_layers(two_layers):
    """Exercise 9.1: two features-sharded layers, each a local matmul and a reduce-scatter.

    Small integers make every sum exact. The output must come out split by features like the
    input, and the only collectives are the two reduce-scatters, no all-reduce or all-gather.
    """
    from jax.sharding import PartitionSpec as P

    import book.display
    import book.hlo

    mesh = line_mesh("model")
    X, W1, W2 = ints((12, 48), 901), ints((48, 64), 902), ints((64, 24), 903)
    args = (
        _put(mesh, X, P(None, "model")),
        _put(mesh, W1, P("model", None)),
        _put(mesh, W2, P("model", None)),
    )
    out, compiled = compile_and_run(two_layers, *args)
    answered(out, "two_layers returns nothing yet; return relu(x @ w1) @ w2")
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
        need(
            r.op != "all-reduce",
            f"The program all-reduces {book.display.shape_text(r)}: every device receives the "
            "whole sum and keeps an eighth of it; psum_scatter delivers each device only its "
            "slice.",
        )
        need(
            r.op != "all-gather",
            f"The program all-gathers {book.display.shape_text(r)}; with features split, "
            "nothing needs gathering: each layer is a local matmul and a psum_scatter.",
        )
    shapes = sorted((r.op, *r.shapes) for r in rows)
    need(
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


@checker
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

    mesh = line_mesh("model")
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
    out, compiled = compile_and_run(tp_block, *args)
    answered(out, "tp_block returns nothing yet; return the block's output")
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
            need(
                shape not in ((B, H), (B, H // 8)),
                f"The program's {op} moves an array of shape {shape}: the hidden activation "
                "leaves its device; sum the partial products of the second layer instead.",
            )
        for op, shape in moved:
            need(
                op != "all-gather",
                f"The program all-gathers {shape}, so every device holds a whole weight; "
                "keep w1 split by columns and w2 by rows, and sum the partial products.",
            )

    hidden_stays(forward)
    need(
        [(r.op, *r.shapes) for r in forward] == [("all-reduce", (B, D))],
        f"Expected one all-reduce of the output's partial sums, {(B, D)}, but the program has "
        f"{[(r.op, *r.shapes) for r in forward]}.",
    )

    def loss(params, x):
        return jnp.mean(jnp.tanh(tp_block(params, x)) * T)

    def ref(params, x):
        return jnp.mean(jnp.tanh(_residual_block(params, x)) * T)

    _, (ref_params, ref_x) = _one_device(ref, params, X, argnums=(0, 1))
    (grad_params, grad_x), backward = compile_and_run(jax.grad(loss, argnums=(0, 1)), *args)
    for name, got, want_grad in [("x", grad_x, ref_x)] + [
        (k, grad_params[k], ref_params[k]) for k in params
    ]:
        need(
            _near(got, want_grad),
            f"The block's output is right but the gradient of {name} is not; let JAX "
            "differentiate through your shard_map with check_vma on, so that it sums the "
            "gradient of the replicated x over the devices.",
        )
    rows = book.hlo.collectives(backward)
    hidden_stays(rows)
    moved = [(r.op, s) for r in rows for s in _row_shapes(r)]
    need(
        {op for op, _ in moved} <= {"all-reduce"},
        f"Expected only all-reduces in the training step, but it has {moved}.",
    )
    need(
        len(moved) <= 2,
        f"The training step all-reduces {len(moved)} arrays where 2 are enough, the output "
        "forward and the gradient of x backward: with check_vma off, JAX cannot tell which "
        "values are the same on every device and sums to be safe; keep it on.",
    )
    need(
        moved == [("all-reduce", (B, D))] * 2,
        f"Expected two all-reduces of shape {(B, D)} in the training step, but it has {moved}.",
    )
    return (
        f"the training step's only collectives are two all-reduces of shape {(B, D)}, the "
        f"block's output forward and the gradient of its input backward, {forward[0].bytes:,} "
        "bytes each per device; the hidden activation never leaves its device."
    )


# Chapter 10 ------------------------------------------------------------------------------


@checker
def ch10_read_once(build):
    """Exercise 10.1: a batch on the 4x2 mesh split over 'data' only, each piece read once.

    The two devices of a 'model' group hold the same rows, and ``make_array_from_callback``
    asks for every device's piece, so it reads each piece twice. The reader's ``build`` must
    read each of the 4 distinct pieces once, put it on both devices that hold it, and never
    read more than one piece at a time. Every shard is compared with the file's rows.
    """
    import jax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import book.data

    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    sharding = NamedSharding(mesh, P("data"))
    source = fresh_source(scratch_folder("book-exercise-"), 96, 5, seed=1001)
    rows = book.data.epoch_order(96, seed=5, epoch=2)[:32]
    batch = book.data.Batch(source, "x", rows)
    function(build, "build", (batch, sharding), "(batch, sharding)")
    want = np.asarray(source.fields["x"][rows])
    source.reads.clear()
    out = build(batch, sharding)
    reads = list(source.reads)
    answered(out, "build returns nothing yet; return the batch as a jax.Array")
    need(
        isinstance(out, jax.Array),
        f"build returned {validate.describe(out)}, not a jax.Array; build one with "
        "jax.make_array_from_callback or its friends.",
    )
    need(out.shape == want.shape, f"The batch has shape {out.shape}; it should be {want.shape}.")
    need(
        out.sharding.is_equivalent_to(sharding, out.ndim),
        f"The batch comes out {_placed(out.sharding)}; build it with the sharding you were "
        "given, P('data') on the 4x2 mesh.",
    )
    for shard in out.addressable_shards:
        need(
            np.array_equal(np.asarray(shard.data), want[shard.index]),
            f"Device {shard.device.id} does not hold rows {shard.index[0].start}:"
            f"{shard.index[0].stop} of the batch, which its index asks for; put each piece on "
            "the devices whose index it was read for.",
        )
    need(reads, "Nothing was read through batch.read; read the pieces with it.")
    piece = want.shape[0] // 4
    need(
        max(reads) <= piece,
        f"One read fetched {max(reads)} rows"
        + (", the whole batch" if max(reads) == want.shape[0] else "")
        + f"; read one piece of {piece} rows at a time, as the devices hold them.",
    )
    need(
        len(reads) != 8,
        f"The batch took 8 reads of {piece} rows, but only 4 pieces differ: the 2 devices of "
        "each 'model' group hold the same rows, so each piece was read twice; read it once and "
        "put it on both devices.",
    )
    need(
        sorted(reads) == [piece] * 4,
        f"The batch took {len(reads)} reads of {reads} rows; 4 reads of {piece} rows, one per "
        "distinct piece, are enough.",
    )
    return (
        f"4 reads of {piece} rows, each piece placed on both devices of its 'model' group, and "
        "every shard holds the right rows."
    )


def _holds_truths(value) -> bool:
    """Whether an answer is an array of True and False, as a mask is."""
    try:
        return np.asarray(value).dtype == np.bool_
    except Exception:  # noqa: BLE001 - a ragged or odd answer: numbers() names it
        return False


@checker
def ch10_padded_epoch(padded_epoch):
    """Exercise 10.2: every batch full size, the last one padded, the padding masked out.

    Checked on batch sizes that leave a remainder and on one that does not: every example
    exactly once among the unmasked rows, padding only in the last batch, and the order a
    deterministic, shuffled function of ``(seed, epoch)`` that every process can compute.
    """
    function(
        padded_epoch, "padded_epoch", (70, 8, 3, 0), "(num_examples, global_batch, seed, epoch)"
    )

    def plan(n, b, seed, epoch):
        rows, mask = pair(padded_epoch(n, b, seed, epoch), "padded_epoch", "(rows, mask)")
        truths = [_holds_truths(rows), _holds_truths(mask)]  # as given, before float64
        rows, mask = numbers(rows, "rows", "[[3, 0], [7, 1]]"), numbers(mask, "mask", "[True]")
        need(
            not (truths[0] and not truths[1]),
            "padded_epoch returns (mask, rows); return them in the other order, (rows, mask).",
        )
        need(
            not truths[0],
            "rows holds True and False; give example numbers, and the truth values in mask.",
        )
        need(
            rows.ndim == 2,
            f"rows has {rows.ndim} dimension(s); give one row of example numbers per batch.",
        )
        steps = -(-n // b)
        need(
            rows.ndim != 2 or rows.shape[0] >= steps,
            f"With {n} examples in batches of {b} an epoch has {steps} batches, not "
            f"{rows.shape[0]}: {n - rows.shape[0] * b} examples are never seen; pad the last "
            "batch instead of dropping it.",
        )
        need(
            rows.shape == (steps, b),
            f"rows has shape {rows.shape}; it should be ({steps}, {b}), every batch {b} rows, "
            "so that each one splits over the devices and the step compiles once.",
        )
        need(mask.shape == rows.shape, f"mask has shape {mask.shape}; give it that of rows.")
        need(
            (rows == np.round(rows)).all() and 0 <= rows.min() and rows.max() < n,
            f"Every entry of rows, padding included, should be an example number from 0 to "
            f"{n - 1}, so that the loader can read it.",
        )
        need(
            np.isin(mask, (0, 1)).all(),
            "mask should hold True for real examples and False for padding.",
        )
        return rows.astype(np.int64), mask.astype(bool)

    for n, b in ((1000, 64), (70, 8), (512, 64)):
        orders = {}
        for seed, epoch in ((3, 0), (3, 1), (4, 1)):
            rows, mask = plan(n, b, seed, epoch)
            ids = rows[mask]
            counts = np.bincount(ids, minlength=n)
            padding = rows.size - n
            if len(ids) == rows.size and padding:
                raise Wrong(
                    f"With {n} examples in batches of {b}, {padding} rows are padding, but "
                    "mask keeps every row, so the padding trains as real examples; set mask "
                    "to False there."
                )
            need(
                len(ids) == n and not (counts != 1).any(),
                f"The unmasked rows of epoch {epoch} ({n} examples, batches of {b}) miss "
                f"{(counts == 0).sum()} examples and repeat {(counts > 1).sum()}; each should "
                "appear exactly once.",
            )
            late = [k for k in range(len(mask) - 1) if not mask[k].all()]
            need(
                not late,
                f"Batch {late[0] if late else 0} of {len(mask)} has masked rows; only the last "
                "batch should be padded, so that every other step trains on a full batch.",
            )
            again = plan(n, b, seed, epoch)
            need(
                np.array_equal(again[0], rows) and np.array_equal(again[1], mask),
                f"Two calls for seed {seed}, epoch {epoch} gave different batches; every "
                "process must compute the same ones, so draw the order from (seed, epoch) only.",
            )
            need(
                not np.array_equal(ids, np.sort(ids)),
                "The examples come in their stored order; shuffle them every epoch.",
            )
            orders[seed, epoch] = ids
        need(
            not np.array_equal(orders[3, 0], orders[3, 1]),
            "Epochs 0 and 1 visit the examples in the same order; shuffle each epoch with its "
            "own order, e.g. book.data.epoch_order(num_examples, seed, epoch).",
        )
        need(
            not np.array_equal(orders[3, 1], orders[4, 1]),
            "Seeds 3 and 4 give the same order; let the seed choose it.",
        )
    return (
        "every batch is full size, only the last one holds masked padding, and each epoch "
        "visits every example once in an order fixed by (seed, epoch)."
    )


def _placed(sharding) -> str:
    """Where an array's sharding puts it, in words a verdict can quote."""
    spec = getattr(sharding, "spec", None)
    if spec is not None:
        return f"as {spec} on its mesh"
    n = len(sharding.device_set)
    return "on one device only" if n == 1 else f"on {n} devices only"
