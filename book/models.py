"""The small MLP of Part III, and the single-device training step every parallel run must match.

Two dense layers with a ReLU between them and a softmax cross-entropy loss: small enough to
train in seconds on mock CPU devices, yet with the two matrix multiplies that data, fully
sharded and tensor parallelism split in different ways. Nothing here is parallel: the chapters
write the parallel versions out, and check them against ``reference_step``.

What a reader passes is checked by shape and dtype only (``_params``, ``_array``), so the
checks hold inside ``jit``, ``grad`` and ``shard_map`` too, where the values are traced: a
parameter dict without ``w2``, labels that are floats or a batch whose features do not match
``w1`` get one sentence instead of an error from deep inside JAX, and a learning rate of
``nan`` is refused rather than turning every parameter into ``nan``.
"""

from __future__ import annotations

import decimal
import fractions
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from book import validate

_TEACHER = 7  # the teacher's own random stream, apart from every seed's inputs
_MAX_NUMBERS = 2**26  # numbers one call may draw: 256 MiB of float32
_PARAMS = {"w1": 2, "b1": 1, "w2": 2, "b2": 1}  # each parameter's rank


def _generator(seed) -> np.random.Generator:
    """NumPy's generator for an integer seed, or for the bits of a ``jax.random`` key.

    A 0-d array of an integer (``jnp.int32(3)``) is the integer it holds.
    """
    seed = validate.scalar(seed)
    if isinstance(seed, (fractions.Fraction, decimal.Decimal)) and seed == int(seed):
        seed = int(seed)  # an exact whole number, as the rest of the book reads one
    if isinstance(seed, (int, np.integer, bool, np.bool_)):
        return np.random.default_rng(validate.whole(seed, "seed", low=0, high=2**63 - 1, example=0))
    if isinstance(seed, jax.Array) and not isinstance(seed, jax.core.Tracer):
        typed = jnp.issubdtype(seed.dtype, jax.dtypes.prng_key)
        if typed or (seed.dtype == jnp.uint32 and seed.ndim == 1):
            return np.random.default_rng(np.asarray(jax.random.key_data(seed)).ravel().tolist())
    raise validate.WrongKind(
        f"seed must be a whole number or a jax.random key such as jax.random.key(0), not "
        f"{validate.describe(seed)}."
    )


def _dtype(dtype):
    """A floating dtype for parameters or inputs, such as ``np.float32`` or ``jnp.bfloat16``.

    A type, not an array or a number (whose dtype NumPy would read), and one JAX has: NumPy's
    ``np.longdouble`` is wider than any of JAX's floats.
    """
    try:
        value = isinstance(dtype, (np.generic, np.ndarray, jax.Array))
        floating = not value and jnp.issubdtype(dtype, jnp.floating)
        floating = floating and 2 <= np.dtype(dtype).itemsize <= 8
    except Exception:  # noqa: BLE001 - not a dtype at all
        floating = False
    if floating and np.dtype(dtype).itemsize == 8 and not jax.config.jax_enable_x64:
        raise validate.BadValue(
            "dtype float64 needs jax_enable_x64 (without it JAX makes float32 arrays); use "
            "np.float32, or turn x64 on first."
        )
    if not floating:
        try:
            shown = np.dtype(dtype).name if not value else validate.describe(dtype)
        except Exception:  # noqa: BLE001 - not a dtype at all
            shown = validate.describe(dtype)
        raise validate.BadValue(
            "dtype must be a floating type of 16 to 64 bits, such as np.float32 or "
            f"jnp.bfloat16, not {shown}."
        )
    return dtype


def _array(value, name: str, ndim: int, *, integer: bool = False):
    """An array (concrete or traced) of ``ndim`` dimensions holding numbers of the right kind."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if not isinstance(shape, tuple) or dtype is None:
        raise validate.WrongKind(
            f"{name} must be an array, such as jnp.asarray(...) gives, not "
            f"{validate.describe(value)}."
        )
    if len(shape) != ndim:
        raise validate.BadValue(f"{name} must have {ndim} dimension(s), not shape {shape}.")
    kind = jnp.integer if integer else jnp.number
    if (
        jnp.issubdtype(dtype, jnp.bool_)
        or jnp.issubdtype(dtype, jnp.complexfloating)
        or not jnp.issubdtype(dtype, kind)
    ):
        wanted = "whole numbers (an integer dtype)" if integer else "real numbers"
        raise validate.BadValue(f"{name} must hold {wanted}, not {dtype}.")
    if jnp.issubdtype(dtype, jnp.floating) and np.dtype(dtype).itemsize < 2:
        raise validate.BadValue(
            f"{name} holds {dtype}, which JAX does not mix with other types in arithmetic; "
            "cast it to float32 or bfloat16 first."
        )
    return value


def _params(params) -> Mapping:
    """The four parameters ``init`` makes, with shapes that fit each other."""
    try:  # a mapping of the reader's own class whose keys cannot be read is no params
        missing = set(_PARAMS) - set(params) if isinstance(params, Mapping) else True
    except Exception:  # noqa: BLE001
        missing = True
    if missing is True:
        raise validate.WrongKind(
            "params must be a dict with w1, b1, w2 and b2, as book.models.init makes, not "
            f"{validate.describe(params)}."
        )
    if missing:
        raise validate.WrongKind(
            f"params has no {', '.join(map(repr, sorted(missing)))}; pass the dict "
            "book.models.init makes, with w1, b1, w2 and b2."
        )
    for name, ndim in _PARAMS.items():
        _array(params[name], f"params[{name!r}]", ndim)
    h, (h2, c) = params["w1"].shape[1], params["w2"].shape
    if params["b1"].shape != (h,) or h2 != h or params["b2"].shape != (c,):
        shapes = ", ".join(f"{k} {params[k].shape}" for k in _PARAMS)
        raise validate.BadValue(
            f"The parameters do not fit each other ({shapes}); w1 (f, h), b1 (h,), w2 (h, c) "
            "and b2 (c,), as book.models.init makes them."
        )
    return params


def _inputs(params, x):
    _params(params)
    _array(x, "x", 2)
    features = params["w1"].shape[0]
    if x.shape[1] != features:
        raise validate.BadValue(
            f"x has {x.shape[1]} features per example but w1 takes {features}; pass a batch "
            f"of shape (batch, {features})."
        )


def _learning_rate(value):
    """A finite number, or a traced or 0-d array one (a schedule's output inside jit)."""
    if isinstance(value, jax.core.Tracer):
        return value
    if (
        isinstance(value, jax.Array)
        and value.shape == ()
        and jnp.issubdtype(value.dtype, jnp.floating)  # a PRNG key's dtype has no kind
        and value.dtype.itemsize >= 2  # float8 mixes with no other type
    ):
        if not value.is_fully_addressable or bool(jnp.isfinite(value)):
            return value
        raise validate.BadValue(f"learning_rate must be a finite number, not {float(value)}.")
    return validate.number(
        value, "learning_rate", low=-np.inf, wanted="a number such as 0.1", error=validate.BadValue
    )


class Sizes(NamedTuple):
    """The shapes of one problem: a batch of ``batch`` inputs of ``features`` numbers each."""

    batch: int
    features: int
    hidden: int
    classes: int


@validate.impostors_refused
def init(seed, features: int, hidden: int, classes: int, dtype=np.float32) -> dict:
    """Parameters ``w1 (features, hidden)``, ``b1 (hidden,)``, ``w2 (hidden, classes)``, ``b2``.

    Weights are drawn with variance ``1 / fan_in`` (LeCun normal), so activations keep roughly
    unit scale through both layers; biases start at zero. The numbers come from NumPy's
    generator: on mock CPU devices every eager JAX operation is compiled first, and drawing with
    NumPy keeps making a problem instant. ``seed`` is an integer or a ``jax.random`` key.
    """
    features = validate.whole(features, "features", high=2**16, example=16)
    hidden = validate.whole(hidden, "hidden", high=2**16, example=32)
    classes = validate.whole(classes, "classes", high=2**16, example=4)
    if features * hidden + hidden * classes > _MAX_NUMBERS:
        raise validate.BadValue(
            f"Weights of {features:,} x {hidden:,} and {hidden:,} x {classes:,} would take more "
            "than 256 MiB; use fewer."
        )
    dtype = _dtype(dtype)
    rng = _generator(seed)
    w1 = rng.standard_normal((features, hidden)) / np.sqrt(features)
    w2 = rng.standard_normal((hidden, classes)) / np.sqrt(hidden)
    arrays = {
        "w1": w1,
        "b1": np.zeros(hidden),
        "w2": w2,
        "b2": np.zeros(classes),
    }
    return {name: jnp.asarray(a, dtype) for name, a in arrays.items()}


@validate.impostors_refused
def forward(params: dict, x):
    """Logits of shape ``(batch, classes)``: ``relu(x @ w1 + b1) @ w2 + b2``."""
    _inputs(params, x)
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


@validate.impostors_refused
def cross_entropy(logits, labels):
    """Mean softmax cross-entropy of integer ``labels`` under ``logits``.

    Split out of ``loss`` so a parallel version that computes the logits its own way can still
    score them the same way. Labels out of range are refused where they are known (outside
    ``jit``), and make the loss nan where they are not.
    """
    _array(logits, "logits", 2)
    _array(labels, "labels", 1, integer=True)
    if labels.shape[0] != logits.shape[0]:
        raise validate.BadValue(
            f"There are {labels.shape[0]} labels for {logits.shape[0]} rows of logits; give one "
            "label per example."
        )
    if 0 in logits.shape:
        raise validate.BadValue(
            f"The logits have shape {logits.shape}: score at least one example over at least "
            "one class."
        )
    if not isinstance(labels, jax.core.Tracer) and labels.size:
        low, high = int(np.min(np.asarray(labels))), int(np.max(np.asarray(labels)))
        if low < 0 or high >= logits.shape[1]:
            raise validate.BadValue(
                f"labels run from {low} to {high}, but there are {logits.shape[1]} classes; "
                f"use labels from 0 to {logits.shape[1] - 1}."
            )
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, labels[:, None], axis=-1)
    # Under jit the labels are not known: one out of range makes the loss nan, where
    # take_along_axis would read another class (-1 the last) or nan past the end, quietly.
    known = (labels[:, None] >= 0) & (labels[:, None] < logits.shape[1])
    return -jnp.mean(jnp.where(known, picked, jnp.nan))


@validate.impostors_refused
def loss(params: dict, x, labels):
    """Mean cross-entropy of the model on one batch."""
    return cross_entropy(forward(params, x), labels)


@validate.impostors_refused
def sgd(params: dict, grads: dict, learning_rate: float) -> dict:
    """Plain SGD: ``p - learning_rate * g`` for every parameter."""
    learning_rate = _learning_rate(learning_rate)
    try:  # a container that holds itself has no structure: JAX recurses into it for ever
        same = jax.tree.structure(params) == jax.tree.structure(grads)
        leaves = jax.tree.leaves((params, grads))
    except Exception:  # noqa: BLE001 - RecursionError, or JAX's SystemError around it
        same, leaves = False, []
    if not same:
        raise validate.BadValue(
            "grads must have the structure of params (the same names, one gradient for each "
            "parameter), as jax.grad gives them."
        )
    for leaf in leaves:
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            raise validate.WrongKind(
                f"params and grads must hold arrays, not {validate.describe(leaf)}."
            )
    for (path, p), g in zip(jax.tree.leaves_with_path(params), jax.tree.leaves(grads)):
        name = jax.tree_util.keystr(path)
        _array(p, f"params{name}", len(p.shape))
        _array(g, f"The gradient of {name}", len(g.shape))
        if tuple(p.shape) != tuple(g.shape):
            raise validate.BadValue(
                f"The gradient of {jax.tree_util.keystr(path)} has shape {tuple(g.shape)}, its "
                f"parameter {tuple(p.shape)}; give each parameter a gradient of its shape."
            )
    return jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)


@validate.impostors_refused
def reference_step(params: dict, x, labels, learning_rate: float = 0.1):
    """One single-device training step: ``(new_params, loss, grads)``.

    The gradients are returned too, because the chapters check parallel gradients against them
    before any update blurs a difference.
    """
    _inputs(params, x)
    learning_rate = _learning_rate(learning_rate)
    value, grads = jax.value_and_grad(loss)(params, x, labels)
    return sgd(params, grads, learning_rate), value, grads


@validate.impostors_refused
def synthetic_data(seed, n: int, features: int, classes: int, dtype=np.float32):
    """``n`` Gaussian inputs labelled by a random linear teacher: a learnable task.

    The labels are ``argmax(x @ teacher)``, so a model with enough capacity can drive the loss
    well below ``log(classes)``, which makes a loss curve worth drawing. The teacher depends on
    ``features`` and ``classes`` only, not on ``seed``, so every seed draws from the same task.
    """
    dtype = _dtype(dtype)
    n = validate.whole(n, "The number of examples (n, a batch)", high=2**24, example=1024)
    features = validate.whole(features, "features", high=2**16, example=16)
    classes = validate.whole(classes, "classes", high=2**16, example=4)
    if n * features > 2**26:
        raise validate.BadValue(
            f"{n:,} examples of {features:,} features would take more than 256 MiB; use fewer."
        )
    teacher = np.random.default_rng([_TEACHER, features, classes]).standard_normal(
        (features, classes)
    )
    x = _generator(seed).standard_normal((n, features)).astype(dtype)
    labels = np.argmax(x @ teacher, axis=-1).astype(np.int32)
    return jnp.asarray(x), jnp.asarray(labels)


@validate.impostors_refused
def param_shapes(sizes: Sizes) -> dict:
    """The shape of each parameter ``init`` makes, for programs compiled without any data."""
    f, h, c = _sizes(sizes)
    return {"w1": (f, h), "b1": (h,), "w2": (h, c), "b2": (c,)}


@validate.impostors_refused
def param_count(sizes: Sizes) -> int:
    """How many numbers the model has: both weight matrices and both biases."""
    f, h, c = _sizes(sizes)
    return f * h + h + h * c + c


def _sizes(sizes) -> tuple[int, int, int]:
    """The features, hidden units and classes of a ``Sizes``."""
    if not isinstance(sizes, Sizes):
        raise validate.WrongKind(
            "Pass a book.models.Sizes, such as Sizes(batch=64, features=16, hidden=32, "
            f"classes=4), not {validate.describe(sizes)}."
        )
    return tuple(
        validate.whole(getattr(sizes, k), f"sizes.{k}", high=2**40, error=validate.BadValue)
        for k in ("features", "hidden", "classes")
    )
