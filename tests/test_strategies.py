"""book.strategies: each step matches one device and communicates as the textbook says."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

from book import cost, models, strategies

SIZES = models.Sizes(batch=64, features=16, hidden=32, classes=8)
PARAM_BYTES = models.param_count(SIZES) * 4
MESHES = {"DP": (8,), "FSDP": (8,), "TP": (8,), "DP x TP": (4, 2)}


@pytest.mark.parametrize("strategy", strategies.STRATEGIES)
def test_step_matches_the_single_device_step(strategy):
    params = models.init(0, SIZES.features, SIZES.hidden, SIZES.classes)
    x, y = models.synthetic_data(1, SIZES.batch, SIZES.features, SIZES.classes)
    ref_params, ref_loss, _ = models.reference_step(params, x, y, strategies.LEARNING_RATE)
    mesh = strategies.mesh(strategy, MESHES[strategy])
    specs = strategies.PARAM_SPECS[strategy]
    batch = NamedSharding(mesh, strategies.BATCH_SPECS[strategy])
    placed = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in params.items()}
    new, loss = strategies.train_step(strategy, mesh)(
        placed, jax.device_put(x, batch), jax.device_put(y, batch)
    )
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for k in params:
        np.testing.assert_allclose(new[k], ref_params[k], rtol=1e-5, atol=1e-6)


def test_dp_all_reduces_the_gradients_and_the_loss():
    a = strategies.analyze("DP", (8,), SIZES)
    assert {r.op for r in a.collectives} == {"all-reduce"}
    assert sum(r.bytes for r in a.collectives) == PARAM_BYTES + 4
    assert a.sent_bytes == cost.all_reduce_bytes(PARAM_BYTES + 4, 8)
    assert a.param_bytes == PARAM_BYTES


def test_fsdp_gathers_parameters_and_scatters_gradients():
    a = strategies.analyze("FSDP", (8,), SIZES)
    by_op = {}
    for r in a.collectives:
        by_op[r.op] = by_op.get(r.op, 0) + r.bytes
    assert by_op == {"all-gather": PARAM_BYTES, "reduce-scatter": PARAM_BYTES // 8, "all-reduce": 4}
    assert a.param_bytes * 8 == PARAM_BYTES
    # On a ring FSDP sends what DP sends: an all-reduce is a reduce-scatter plus an all-gather.
    dp = strategies.analyze("DP", (8,), SIZES)
    assert a.sent_bytes == pytest.approx(dp.sent_bytes)


def test_tp_moves_only_the_logits():
    a = strategies.analyze("TP", (8,), SIZES)
    ((op, shape, n),) = [(r.op, *r.shapes, r.group_size) for r in a.collectives]
    assert (op, shape, n) == ("all-reduce", (SIZES.batch, SIZES.classes), 8)
    replicated_b2 = SIZES.classes * 4
    assert a.param_bytes == (PARAM_BYTES - replicated_b2) // 8 + replicated_b2


def test_dp_x_tp_groups_follow_the_mesh_axes():
    a = strategies.analyze("DP x TP", (4, 2), SIZES)
    logits = [r for r in a.collectives if r.group_size == 2]
    grads = [r for r in a.collectives if r.group_size == 4]
    assert [r.shapes for r in logits] == [((SIZES.batch // 4, SIZES.classes),)]
    assert logits[0].groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert sum(r.bytes for r in grads) == a.param_bytes + 4
    assert grads[0].groups == ((0, 2, 4, 6), (1, 3, 5, 7))


def test_smaller_meshes_use_the_first_devices_and_the_cache():
    a = strategies.analyze("DP", (2,), SIZES)
    assert a.collectives[0].group_size == 2
    assert strategies.analyze("DP", (2,), SIZES) is a
    assert [d.id for d in strategies.mesh("DP", (2,)).devices.flat] == [0, 1]
