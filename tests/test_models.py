"""book.models: shapes, a loss that matches its definition, gradients, and a step that learns."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from book import models

SIZES = models.Sizes(batch=32, features=8, hidden=16, classes=4)


@pytest.fixture(scope="module")
def setup():
    params = models.init(0, SIZES.features, SIZES.hidden, SIZES.classes)
    x, y = models.synthetic_data(1, SIZES.batch, SIZES.features, SIZES.classes)
    return params, x, y


def test_init_shapes_and_scale(setup):
    params, _, _ = setup
    assert {k: v.shape for k, v in params.items()} == {
        "w1": (8, 16),
        "b1": (16,),
        "w2": (16, 4),
        "b2": (4,),
    }
    assert all(v.dtype == jnp.float32 for v in params.values())
    assert not params["b1"].any() and not params["b2"].any()
    big = models.init(2, 256, 512, 4)
    assert abs(float(jnp.std(big["w1"])) - 1 / 16) < 0.01  # variance 1 / fan_in
    assert sum(v.size for v in params.values()) == models.param_count(SIZES)


def test_forward_is_two_layers_with_relu(setup):
    params, x, _ = setup
    p = jax.tree.map(np.asarray, params)
    h = np.maximum(np.asarray(x) @ p["w1"] + p["b1"], 0)
    np.testing.assert_allclose(models.forward(params, x), h @ p["w2"] + p["b2"], rtol=1e-5)


def test_loss_is_mean_cross_entropy(setup):
    params, x, y = setup
    logits = np.asarray(models.forward(params, x), np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -log_probs[np.arange(len(y)), np.asarray(y)].mean()
    np.testing.assert_allclose(models.loss(params, x, y), expected, rtol=1e-5)
    # Uniform logits give log(classes).
    np.testing.assert_allclose(
        models.cross_entropy(jnp.zeros((3, 4)), jnp.array([0, 1, 3])), np.log(4), rtol=1e-6
    )


def test_reference_step_returns_gradients_and_applies_sgd(setup):
    params, x, y = setup
    new, value, grads = models.reference_step(params, x, y, learning_rate=0.5)
    np.testing.assert_allclose(value, models.loss(params, x, y), rtol=1e-6)
    g_b2 = jax.grad(models.loss)(params, x, y)["b2"]
    np.testing.assert_allclose(grads["b2"], g_b2, rtol=1e-6)
    for k in params:
        np.testing.assert_allclose(new[k], params[k] - 0.5 * grads[k], rtol=1e-6, atol=1e-7)


def test_training_lowers_the_loss(setup):
    params, x, y = setup
    step = jax.jit(models.reference_step)
    first = None
    for _ in range(50):
        params, value, _ = step(params, x, y, 0.5)
        first = value if first is None else first
    assert float(value) < 0.5 * float(first)


def test_synthetic_labels_come_from_a_teacher():
    x, y = models.synthetic_data(3, 1000, 8, 4)
    assert x.shape == (1000, 8) and y.shape == (1000,) and y.dtype == jnp.int32
    assert set(np.unique(y)) == {0, 1, 2, 3}
    x2, y2 = models.synthetic_data(3, 1000, 8, 4)
    np.testing.assert_array_equal(y, y2)
    # Another seed draws other inputs, labelled by the same teacher.
    x3, _ = models.synthetic_data(4, 1000, 8, 4)
    assert not np.allclose(x, x3)


def test_model_making_is_deterministic():
    a = models.init(5, 8, 16, 4)
    b = models.init(5, 8, 16, 4)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.allclose(a["w1"], models.init(6, 8, 16, 4)["w1"])


def test_an_exact_whole_number_works_as_a_seed():
    from fractions import Fraction

    np.testing.assert_array_equal(
        models.init(Fraction(3), 4, 8, 3)["w1"], models.init(3, 4, 8, 3)["w1"]
    )


def test_a_jax_key_works_as_a_seed():
    a = models.init(jax.random.key(1), 8, 16, 4)
    b = models.init(jax.random.key(1), 8, 16, 4)
    np.testing.assert_array_equal(a["w1"], b["w1"])
    x, _ = models.synthetic_data(jax.random.key(2), 10, 8, 4)
    assert x.shape == (10, 8)


def test_a_key_given_as_the_learning_rate_is_refused_in_one_sentence(setup):
    from book.errors import ReaderError

    params = setup[0]
    with pytest.raises(ReaderError, match="learning_rate must be a number"):
        models.sgd(params, params, jax.random.key(0))
    assert models.sgd(params, params, jnp.float32(0.5))["w1"].shape == params["w1"].shape


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda p, x, y: models.init(0, 4, 8, 3, dtype=jnp.float8_e4m3fn), "not float8_e4m3fn"),
        (lambda p, x, y: models.forward(p, x.astype(jnp.float8_e4m3fn)), "cast it to float32"),
        (lambda p, x, y: models.init(0, 4, 8, 3, dtype=np.float64), "needs jax_enable_x64"),
        (lambda p, x, y: models.synthetic_data(0, 8, 4, 3, dtype="float64"), "needs jax_enable"),
        (lambda p, x, y: models.loss({k: p[k] for k in ("w1", "b1")}, x, y), "has no 'b2', 'w2'"),
        (lambda p, x, y: models.loss(p, x.astype(jnp.complex64), y), "real numbers"),
        (lambda p, x, y: models.loss(p, x[:0], y[:0]), "at least one example"),
        (lambda p, x, y: models.cross_entropy(jnp.ones((2, 0)), y[:2]), "at least one class"),
        (
            lambda p, x, y: models.sgd(p, jax.tree.map(lambda a: a.astype(jnp.complex64), p), 1),
            "real numbers",
        ),
        (
            lambda p, x, y: models.sgd(
                p, {**p, "b2": jax.random.split(jax.random.key(0), p["b2"].shape)}, 0.1
            ),
            "real numbers, not key",
        ),
    ],
)
def test_kinds_the_model_cannot_compute_with_are_refused_in_one_sentence(setup, call, words):
    from book.errors import ReaderError

    with pytest.raises(ReaderError, match=words):
        call(*setup)
