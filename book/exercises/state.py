"""Checkers for chapter 16: the state of a training run, accumulated and restored."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import numpy as np

from book import validate
from book.exercises.core import (
    Wrong,
    answered,
    checker,
    compile_and_run,
    first_sentence,
    function,
    need,
    scratch_folder,
    spec_text,
)
from book.exercises.training import _compare, _loss_and_grads, _one_device, _problem

# The masked problem of exercise 16.1: 3 microbatches of 32 rows, of which these many are real.
_REAL_ROWS = (32, 20, 7)


def _masked_problem():
    """Fresh parameters, stacked microbatches and a mask, with the one-device reference."""
    from book import models

    sizes = models.Sizes(batch=96, features=24, hidden=40, classes=8)
    params, x, y = _problem(1601, sizes)
    k, b = len(_REAL_ROWS), sizes.batch // len(_REAL_ROWS)
    xs, ys = x.reshape(k, b, -1), y.reshape(k, b)
    mask = np.zeros((k, b), np.float32)
    for i, real in enumerate(_REAL_ROWS):
        mask[i, :real] = 1
    real_x = np.concatenate([xs[i, :real] for i, real in enumerate(_REAL_ROWS)])
    real_y = np.concatenate([ys[i, :real] for i, real in enumerate(_REAL_ROWS)])
    return params, xs, ys, mask, real_x, real_y


def _mean_of_means(params, xs, ys, mask):
    """The usual mistake: each microbatch's mean over its real rows, averaged over microbatches."""
    import jax

    from book import models

    def masked_mean(params, x, y, m):
        per_example = jax.vmap(models.loss, in_axes=(None, 0, 0))(params, x[:, None], y[:, None])
        return (per_example * m).sum() / m.sum()

    results = [
        _one_device(masked_mean, params, xs[i], ys[i], mask[i]) for i in range(len(_REAL_ROWS))
    ]
    loss = np.mean([float(r[0]) for r in results])
    grads = {k: np.mean([np.asarray(r[1][k]) for r in results], axis=0) for k in params}
    return loss, grads


def _uses_scan(fn, *args) -> bool:
    import jax

    return "scan" in str(jax.make_jaxpr(fn)(*args))


@checker
def ch16_masked_mean_grads(masked_mean_grads):
    """Exercise 16.1: the mean loss over the real rows of padded microbatches, with a scan.

    Three microbatches of 32 rows hold 32, 20 and 7 real examples. The reference is the
    gradient of the mean loss over those 59 examples, on one device. Two mistakes get their
    own sentence: the mean of the microbatches' own means (it weighs the 7 examples of the last
    microbatch like the 32 of the first), and a division by all 96 rows, padding included.
    """

    from book import models

    params, xs, ys, mask, real_x, real_y = _masked_problem()
    out, _ = compile_and_run(masked_mean_grads, params, xs, ys, mask)
    answered(out, "masked_mean_grads returns nothing yet; return (loss, grads)")
    ref_loss, ref_grads = _one_device(models.loss, params, real_x, real_y)
    padded = float(mask.sum()) / mask.size
    mean_loss, mean_grads = _mean_of_means(params, xs, ys, mask)
    why = (
        "you averaged the microbatches' own means, which weighs each of the last "
        "microbatch's 7 examples 32/7, about 4.6, times as much as each of the first's; add "
        "up losses and counts, and divide "
        "once at the end"
    )
    loss, _ = _loss_and_grads(
        out,
        "masked_mean_grads",
        ref_loss,
        ref_grads,
        loss_factors={padded: "you divided by all 96 rows; divide by the real ones, mask.sum()"},
        grad_factors={padded: "you divided by all 96 rows; divide by the real ones, mask.sum()"},
        known_losses=[(mean_loss, why)],
    )
    for name, want in mean_grads.items():
        _compare(f"The gradient of {name}", out[1][name], ref_grads[name], known=[(want, why)])
    need(
        _uses_scan(masked_mean_grads, params, xs, ys, mask),
        "The numbers are right, but the program has no scan: a Python loop over the "
        "microbatches compiles one copy of the forward and backward pass per microbatch; "
        "use jax.lax.scan.",
    )
    return (
        f"loss {float(loss):.4f} and gradients match one device's over the 59 real examples, "
        "computed one microbatch at a time by a scan."
    )


def _saved_state(mesh, layout):
    """A train state of another size than the chapter's, with its AdamW's structure, on ``mesh``.

    Drawn with NumPy: the checker only needs values to compare, and eager JAX operations
    would each be compiled first.
    """
    import jax
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rng = np.random.default_rng(1602)
    shapes = {"w1": (32, 64), "b1": (64,), "w2": (64, 8), "b2": (8,)}
    params = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    decayed = {"w1": True, "b1": False, "w2": True, "b2": False}  # as chapter 16
    optimizer = optax.adamw(1e-2, weight_decay=1e-4, mask=decayed)
    opt = optax.tree_map_params(
        optimizer,
        lambda _, p: rng.standard_normal(p.shape).astype(np.float32),
        jax.eval_shape(optimizer.init, params),
        params,
        transform_non_params=lambda leaf: np.asarray(3, leaf.dtype),
    )
    by_name = {k: NamedSharding(mesh, layout[k]) for k in params}
    for k, sharding in by_name.items():
        try:
            sharding.shard_shape(params[k].shape)
        except Exception as err:  # noqa: BLE001 - JAX's own refusal of the spec
            raise Wrong(
                f"layout cannot place {k}, of shape {params[k].shape}, as "
                f"{spec_text(layout[k])}: {first_sentence(err)}."
            ) from None
    shardings = {
        "params": by_name,
        "opt": optax.tree_map_params(
            optimizer,
            lambda _, s: s,
            opt,
            by_name,
            transform_non_params=lambda _: NamedSharding(mesh, P()),
        ),
    }
    return jax.device_put({"params": params, "opt": opt}, shardings)


def _leaves_with_paths(tree):
    import jax

    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in leaves]


def _placement(sharding) -> str:
    """Where a restored array lives, in the words of the chapter: a spec on a mesh's shape."""
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or not hasattr(sharding, "spec"):
        return f"an array on {len(sharding.device_set)} device(s) without a mesh"
    shape = " x ".join(str(n) for n in mesh.devices.shape)
    return f"{spec_text(sharding.spec)} on a {shape} mesh"


def _check_layout(layout):
    from jax.sharding import PartitionSpec as P

    names = {"w1", "b1", "w2", "b2"}
    if isinstance(layout, Mapping) and not isinstance(layout, dict):
        layout = dict(layout)  # a read-only mapping is a layout too
    need(
        isinstance(layout, dict) and set(layout) == names,
        "Pass the chapter's layout: a dict of a PartitionSpec for each of w1, b1, w2 and b2.",
    )
    need(
        all(isinstance(s, P) for s in layout.values()),
        "Each entry of layout should be a PartitionSpec, such as P('data', 'model').",
    )
    axes = set()
    for name, spec in layout.items():
        named = [a for part in spec for a in (part if isinstance(part, tuple) else (part,))]
        need(
            len(spec) <= (1 if name.startswith("b") else 2),
            f"layout[{name!r}] is {spec}, more dimensions than {name} has; give one entry per "
            "dimension.",
        )
        need(
            len([a for a in named if a]) == len(set(a for a in named if a)),
            f"layout[{name!r}] is {spec}, which names a mesh axis twice; an axis splits one "
            "dimension at most.",
        )
        axes |= set(named)
    need(
        axes <= {"data", "model", None},
        "The layout names mesh axes other than 'data' and 'model'; use the chapter's layout.",
    )
    return layout


@checker
def ch16_restore_on(restore_on, layout):
    """Exercise 16.2: restore a checkpoint onto a mesh it was not saved from.

    The checker saves a fresh train state from the 2 x 4 mesh with orbax, calls the reader's
    function with the checkpoint's path and a 1 x 8 mesh, and checks every array bit for bit
    and its sharding: the parameters and their moments laid out by ``layout``, the count
    replicated. The folder is removed however the answer ends.
    """
    import shutil
    from pathlib import Path

    import jax
    import orbax.checkpoint as ocp
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    layout = _check_layout(layout)
    saving = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    target = jax.make_mesh((1, 8), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    folder = Path(scratch_folder("ch16-exercise-"))
    function(restore_on, "restore_on", (folder / "state", target), "(path, mesh)")
    state = _saved_state(saving, layout)
    try:
        path = folder / "state"
        with contextlib.closing(ocp.StandardCheckpointer()) as checkpointer:  # and its threads
            checkpointer.save(path, state)
            checkpointer.wait_until_finished()
        out = restore_on(path, target)
        answered(out, "restore_on returns nothing yet; return the restored train state")
        need(
            isinstance(out, dict) and set(out) == {"params", "opt"},
            "restore_on should return the train state as saved: a dict with 'params' and 'opt'.",
        )
        need(
            jax.tree.structure(out) == jax.tree.structure(state),
            "The restored state has another structure than the saved one; restore the whole "
            "tree, optimizer state included.",
        )
        want = dict(_leaves_with_paths(state))
        found = _leaves_with_paths({"params": out["params"]}) + _leaves_with_paths(
            {"opt": out["opt"]}
        )
        for where, leaf in found:
            need(
                isinstance(leaf, jax.Array),
                f"state{where} came back as {validate.describe(leaf)}; give every leaf of the "
                "target a sharding so that it is restored as a jax.Array on the mesh.",
            )
            np.testing.assert_array_equal(np.asarray(leaf), np.asarray(want[where]))
            name = where.split("'")[-2] if "'" in where else ""
            spec = layout.get(name, P()) if leaf.ndim else P()
            expected = NamedSharding(target, spec)
            need(
                leaf.sharding.is_equivalent_to(expected, leaf.ndim),
                f"state{where} comes back as {_placement(leaf.sharding)}; restore it as "
                f"{spec_text(spec)} on the 1 x 8 mesh you were given.",
            )
    except AssertionError:
        raise Wrong(
            "A restored array differs from the saved one; restore from the path you were given."
        ) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return "every array restored bit for bit onto the 1 x 8 mesh, laid out by layout."
