"""The small MLP of Part III, and the single-device training step every parallel run must match.

Two dense layers with a ReLU between them and a softmax cross-entropy loss: small enough to
train in seconds on mock CPU devices, yet with the two matrix multiplies that data, fully
sharded and tensor parallelism split in different ways. Nothing here is parallel: the chapters
write the parallel versions out, and check them against ``reference_step``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from book import validate

_TEACHER = 7  # the teacher's own random stream, apart from every seed's inputs


def _generator(seed) -> np.random.Generator:
    """NumPy's generator for an integer seed, or for the bits of a ``jax.random`` key."""
    if isinstance(seed, (int, np.integer, bool, np.bool_)):
        return np.random.default_rng(validate.whole(seed, "seed", low=0, example=0))
    if not isinstance(seed, jax.Array):
        raise validate.WrongKind(
            f"seed must be a whole number or a jax.random key, not {validate.describe(seed)}."
        )
    return np.random.default_rng(np.asarray(jax.random.key_data(seed)).ravel().tolist())


class Sizes(NamedTuple):
    """The shapes of one problem: a batch of ``batch`` inputs of ``features`` numbers each."""

    batch: int
    features: int
    hidden: int
    classes: int


def init(seed, features: int, hidden: int, classes: int, dtype=np.float32) -> dict:
    """Parameters ``w1 (features, hidden)``, ``b1 (hidden,)``, ``w2 (hidden, classes)``, ``b2``.

    Weights are drawn with variance ``1 / fan_in`` (LeCun normal), so activations keep roughly
    unit scale through both layers; biases start at zero. The numbers come from NumPy's
    generator: on mock CPU devices every eager JAX operation is compiled first, and drawing with
    NumPy keeps making a problem instant. ``seed`` is an integer or a ``jax.random`` key.
    """
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


def forward(params: dict, x):
    """Logits of shape ``(batch, classes)``: ``relu(x @ w1 + b1) @ w2 + b2``."""
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def cross_entropy(logits, labels):
    """Mean softmax cross-entropy of integer ``labels`` under ``logits``.

    Split out of ``loss`` so a parallel version that computes the logits its own way can still
    score them the same way.
    """
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, labels[:, None], axis=-1)
    return -jnp.mean(picked)


def loss(params: dict, x, labels):
    """Mean cross-entropy of the model on one batch."""
    return cross_entropy(forward(params, x), labels)


def sgd(params: dict, grads: dict, learning_rate: float) -> dict:
    """Plain SGD: ``p - learning_rate * g`` for every parameter."""
    return jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)


def reference_step(params: dict, x, labels, learning_rate: float = 0.1):
    """One single-device training step: ``(new_params, loss, grads)``.

    The gradients are returned too, because the chapters check parallel gradients against them
    before any update blurs a difference.
    """
    value, grads = jax.value_and_grad(loss)(params, x, labels)
    return sgd(params, grads, learning_rate), value, grads


def synthetic_data(seed, n: int, features: int, classes: int, dtype=np.float32):
    """``n`` Gaussian inputs labelled by a random linear teacher: a learnable task.

    The labels are ``argmax(x @ teacher)``, so a model with enough capacity can drive the loss
    well below ``log(classes)``, which makes a loss curve worth drawing. The teacher depends on
    ``features`` and ``classes`` only, not on ``seed``, so every seed draws from the same task.
    """
    n = validate.whole(n, "n", high=2**24, example=1024)
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


def param_shapes(sizes: Sizes) -> dict:
    """The shape of each parameter ``init`` makes, for programs compiled without any data."""
    f, h, c = sizes.features, sizes.hidden, sizes.classes
    return {"w1": (f, h), "b1": (h,), "w2": (h, c), "b2": (c,)}


def param_count(sizes: Sizes) -> int:
    """How many numbers the model has: both weight matrices and both biases."""
    f, h, c = sizes.features, sizes.hidden, sizes.classes
    return f * h + h + h * c + c
