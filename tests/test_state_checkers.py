"""Chapter 16's checkers accept a right answer and name the plausible wrong ones in one sentence."""

import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from book import exercises, models

LAYOUT = {
    "w1": P("data", "model"),
    "b1": P(("data", "model")),
    "w2": P("model", "data"),
    "b2": P(("data", "model")),
}


def rejected(verdict, words):
    assert not verdict.ok and verdict.judged and words in verdict.message, verdict.message
    assert "\n" not in verdict.message


def masked_sums(params, x, y, m):
    each = jax.vmap(models.loss, in_axes=(None, 0, 0))(params, x[:, None], y[:, None])
    return jnp.sum(m * each)


def scanned(divide):
    """The exercise's accumulation, with the final division chosen by ``divide``."""

    def mean_grads(params, xs, ys, mask):
        def add_one(total, microbatch):
            value = jax.value_and_grad(masked_sums)(params, *microbatch)
            return jax.tree.map(jnp.add, total, value), None

        zeros = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
        total, _ = jax.lax.scan(add_one, zeros, (xs, ys, mask))
        return jax.tree.map(lambda t: t / divide(mask), total)

    return mean_grads


def test_masked_mean_grads_accepts_the_scan():
    verdict = exercises.ch16_masked_mean_grads(scanned(lambda mask: mask.sum()))
    assert verdict.ok, verdict.message
    assert "59 real examples" in verdict.message


def test_masked_mean_grads_names_the_usual_mistakes():
    rejected(exercises.ch16_masked_mean_grads(lambda *args: None), "Not answered yet")
    rejected(exercises.ch16_masked_mean_grads(scanned(lambda mask: mask.size)), "all 96 rows")

    def mean_of_means(params, xs, ys, mask):
        def add_one(total, microbatch):
            m = microbatch[2]
            value = jax.value_and_grad(masked_sums)(params, *microbatch)
            return jax.tree.map(lambda t, v: t + v / m.sum(), total, value), None

        zeros = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
        total, _ = jax.lax.scan(add_one, zeros, (xs, ys, mask))
        return jax.tree.map(lambda t: t / xs.shape[0], total)

    rejected(exercises.ch16_masked_mean_grads(mean_of_means), "microbatches' own means")

    def python_loop(params, xs, ys, mask):
        value = jax.value_and_grad(masked_sums)
        parts = [value(params, xs[i], ys[i], mask[i]) for i in range(xs.shape[0])]
        total = jax.tree.map(lambda *t: sum(t), *parts)
        return jax.tree.map(lambda t: t / mask.sum(), total)

    rejected(exercises.ch16_masked_mean_grads(python_loop), "jax.lax.scan")
    rejected(exercises.ch16_masked_mean_grads(lambda *args: 1 / 0), "ZeroDivisionError")


def restore_on(path, mesh, layout=LAYOUT):
    """The exercise's solution, the parameters laid out by ``layout``."""
    decayed = {"w1": True, "b1": False, "w2": True, "b2": False}  # as chapter 16
    optimizer = optax.adamw(1e-2, weight_decay=1e-4, mask=decayed)

    def on_mesh(leaf, spec):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))

    checkpointer = ocp.StandardCheckpointer()
    saved = checkpointer.metadata(path).item_metadata["params"]
    params = {name: on_mesh(saved[name], spec) for name, spec in layout.items()}
    opt = optax.tree_map_params(
        optimizer,
        lambda _, param: param,
        jax.eval_shape(optimizer.init, params),
        params,
        transform_non_params=lambda leaf: on_mesh(leaf, P()),
    )
    return checkpointer.restore(path, {"params": params, "opt": opt})


def test_restore_on_accepts_the_solution_and_names_a_wrong_layout():
    verdict = exercises.ch16_restore_on(restore_on, LAYOUT)
    assert verdict.ok, verdict.message
    rejected(exercises.ch16_restore_on(lambda path, mesh: None, LAYOUT), "Not answered yet")
    replicated = {name: P() for name in LAYOUT}
    rejected(
        exercises.ch16_restore_on(lambda path, mesh: restore_on(path, mesh, replicated), LAYOUT),
        "state['params']['b1'] comes back as P() on a 1 x 8 mesh; restore it as P(('data', "
        "'model'))",
    )

    def params_only(path, mesh):
        return {"params": restore_on(path, mesh)["params"], "opt": None}

    rejected(exercises.ch16_restore_on(params_only, LAYOUT), "another structure")


def test_restore_on_refuses_a_layout_that_is_not_the_chapters():
    rejected(exercises.ch16_restore_on(restore_on, None), "Pass the chapter's layout")
    wrong_axis = dict(LAYOUT, w1=P("rows", None))
    rejected(exercises.ch16_restore_on(restore_on, wrong_axis), "other than 'data'")
    rejected(exercises.ch16_restore_on(restore_on, dict(LAYOUT, w1="data")), "PartitionSpec")
