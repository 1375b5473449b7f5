"""Chapter 14's checkers accept right answers and name the plausible wrong ones, in one sentence."""

from fractions import Fraction

import numpy as np
import pytest

from book import exercises
from book.exercises import pipeline as checks
from book.lessons import pipeline


def rejected(verdict, words):
    assert verdict.judged and not verdict.ok and words in verdict.message, verdict.message
    assert "\n" not in verdict.message


def stage_work(t, s, p, m, v, n_layers):
    k = t - s
    if not 0 <= k < v * m:
        return None
    run = (k // m) * p + s
    size = n_layers // (p * v)
    return k % m, list(range(run * size, (run + 1) * size))


# The schedule rules the checkers measure with: each against a count made another way.


@pytest.mark.parametrize("p, m, v", [(1, 1, 1), (4, 2, 1), (8, 8, 1), (4, 6, 2), (3, 5, 3)])
def test_every_item_runs_once_on_every_stage_one_step_after_the_last(p, m, v):
    grid = pipeline.schedule(p, m, v)
    assert grid.shape == (p, v * m + p - 1)
    for s in range(p):
        busy = grid[s][grid[s] >= 0]
        assert busy.tolist() == list(range(v * m))  # every item once, in order
        assert (np.flatnonzero(grid[s] >= 0) == np.arange(v * m) + s).all()
    assert checks.bubble(p, m, v) == Fraction(p - 1, v * m + p - 1)


@pytest.mark.parametrize("p, m, v", [(4, 8, 2), (2, 6, 3), (4, 4, 2), (3, 9, 1)])
def test_item_runs_each_trip_once_and_depth_first_waits_for_nothing(p, m, v):
    k = np.arange(v * m)
    for depth_first in (False, True):
        micro, group = pipeline.item(k, m, v, p, depth_first)
        assert sorted(zip(micro.tolist(), group.tolist())) == [
            (j, g) for j in range(m) for g in range(v)
        ]
        for j in range(m):  # trip g + 1 starts once trip g is back at stage 0
            starts = k[micro == j]
            assert group[micro == j].tolist() == list(range(v))
            assert (np.diff(starts) >= p).all()
            if depth_first:
                assert (np.diff(starts) == p).all()  # straight on, no wait


def test_by_stage_gives_group_g_of_stage_s_run_g_p_plus_s_and_inverts():
    layers = np.arange(24)
    staged = pipeline.by_stage(layers, 3, 2)  # runs of 4 layers
    assert staged.shape == (3, 2, 4)
    assert staged[1, 1].tolist() == [16, 17, 18, 19]  # run 1 * 3 + 1 = 4
    assert pipeline.from_stages(staged).tolist() == layers.tolist()


@pytest.mark.parametrize(
    "stacked, p, v",
    [(np.arange(16), 3, 1), (np.arange(8), 0, 2), (1.0, 2, 1), (np.arange(8), -4, -2)],
)
def test_by_stage_of_layers_that_do_not_split_evenly_says_so(stacked, p, v):
    with pytest.raises(ValueError, match=f"p = {p} and v = {v}, each 1 or more, must divide"):
        pipeline.by_stage(stacked, p, v)


@pytest.mark.parametrize("p, m", [(4, 8), (6, 4), (3, 7), (1, 3)])
def test_both_orders_take_2_m_plus_p_minus_1_steps_and_hold_what_the_books_say(p, m):
    for order, peak in (
        (pipeline.gpipe_order, [m] * p),
        (pipeline.one_f_one_b_order, [min(p - s, m) for s in range(p)]),
    ):
        steps = pipeline.simulate([order(p, m, s) for s in range(p)])
        assert len(steps) == 2 * (m + p - 1)
        held = pipeline.in_flight(steps)
        assert held.max(axis=0).tolist() == peak and (held[-1] == 0).all()


def test_simulate_names_a_deadlock():
    with pytest.raises(ValueError, match="deadlock"):
        pipeline.simulate([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]])


# Exercise 14.1


def test_microbatches_accepts_the_smallest_counts():
    verdict = exercises.ch14_microbatches(63, 16)
    assert verdict.ok and "10.0%" in verdict.message and "9.9%" in verdict.message, verdict
    assert exercises.ch14_microbatches(63.0, np.int64(16)).ok


def test_microbatches_names_the_usual_mistakes():
    rejected(exercises.ch14_microbatches(None, None), "Not answered yet")
    rejected(exercises.ch14_microbatches(62, 16), "over 10%")
    rejected(exercises.ch14_microbatches(64, 16), "fewer microbatches do too")
    rejected(exercises.ch14_microbatches(70, 16), "(p - 1) / m at 10%")
    rejected(exercises.ch14_microbatches(63, 18), "(p - 1) / (v m) at 10%")
    rejected(exercises.ch14_microbatches(63, 63), "GPipe's answer")
    rejected(exercises.ch14_microbatches(63, 15), "over 10%")
    rejected(exercises.ch14_microbatches(63, 4), "m >= p")
    rejected(exercises.ch14_microbatches(62.5, 16), "whole, positive")
    rejected(exercises.ch14_microbatches(float("nan"), 16), "must be a finite number")
    rejected(exercises.ch14_microbatches(10**15, 16), "far more")
    rejected(exercises.ch14_microbatches("63", 16), "not '63' (a string)")
    rejected(exercises.ch14_microbatches(True, 16), "not True")


# Exercise 14.2


def test_stage_work_accepts_the_rule_and_numpy_answers():
    assert exercises.ch14_stage_work(stage_work).ok

    def as_arrays(*args):
        found = stage_work(*args)
        return found and (np.int64(found[0]), np.array(found[1]))

    assert exercises.ch14_stage_work(as_arrays).ok


def test_stage_work_names_the_usual_mistakes():
    rejected(exercises.ch14_stage_work(lambda t, s, p, m, v, n: ...), "Not answered yet")
    rejected(exercises.ch14_stage_work(None), "Not answered yet")
    rejected(exercises.ch14_stage_work(lambda t, s, p, m, v: None), "take (t, s, p, m, v, n_l")

    def group_for_microbatch(t, s, p, m, v, n):
        found = stage_work(t, s, p, m, v, n)
        return found and ((t - s) // m, found[1])

    rejected(exercises.ch14_stage_work(group_for_microbatch), "is the layer group")

    def consecutive_groups(t, s, p, m, v, n):
        found, size = stage_work(t, s, p, m, v, n), n // (p * v)
        run = v * s + (t - s) // m
        return found and (found[0], list(range(run * size, (run + 1) * size)))

    rejected(exercises.ch14_stage_work(consecutive_groups), "groups consecutive")
    rejected(exercises.ch14_stage_work(lambda t, s, p, m, v, n: None), "not None")
    rejected(
        exercises.ch14_stage_work(lambda t, s, p, m, v, n: stage_work(t, s, p, m, v, n) or (0, [])),
        "so return None",
    )
    rejected(exercises.ch14_stage_work(lambda t, s, p, m, v, n: t - s), "two things")

    def reversed_layers(t, s, p, m, v, n):
        found = stage_work(t, s, p, m, v, n)
        return found and (found[0], found[1][::-1])

    rejected(exercises.ch14_stage_work(reversed_layers), "applies layers")


# Exercise 14.3


def test_in_flight_accepts_the_counts():
    verdict = exercises.ch14_in_flight([4] * 6, [4, 4, 4, 3, 2, 1])
    assert verdict.ok and "4, 4, 4, 3, 2, 1" in verdict.message, verdict
    assert exercises.ch14_in_flight(np.full(6, 4), (4, 4, 4, 3, 2, 1)).ok


def test_in_flight_names_the_usual_mistakes():
    rejected(exercises.ch14_in_flight(None, None), "Not answered yet")
    rejected(exercises.ch14_in_flight([4] * 6, None), "Not answered yet")
    rejected(exercises.ch14_in_flight([9] * 6, [4, 4, 4, 3, 2, 1]), "steps of the schedule")
    rejected(exercises.ch14_in_flight([6] * 6, [4, 4, 4, 3, 2, 1]), "all 4 forwards")
    rejected(exercises.ch14_in_flight([4] * 6, [6, 5, 4, 3, 2, 1]), "only 4")
    rejected(exercises.ch14_in_flight([4] * 6, [1, 2, 3, 4, 4, 4]), "reversed")
    rejected(exercises.ch14_in_flight([4] * 6, [4, 4, 3, 3, 2, 1]), "p - s - 1 forwards")
    rejected(exercises.ch14_in_flight([4] * 5, [4, 4, 4, 3, 2, 1]), "one per stage")
    rejected(exercises.ch14_in_flight("four", [4, 4, 4, 3, 2, 1]), "list of 6 numbers")


def test_dropout_masks_follow_microbatch_and_layer_on_a_circular_tp_pipeline():
    """Chapter 14 checks its dropout on a line of stages; here with v = 2 on 4 stages and
    the stream's model axis: the same loss and gradients as one device with the same keys."""
    import chex
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType

    from book.lessons import transformer

    m, micro, seq, rate = 4, 2, 8, 0.25
    cfg = transformer.Config(n_layers=8)
    params = transformer.init_params(cfg)
    sequences = np.random.default_rng(1).integers(0, cfg.vocab, (m * micro, seq + 1))
    tokens, targets = sequences[:, :-1].astype(np.int32), sequences[:, 1:].astype(np.int32)
    mesh = jax.make_mesh((2, 4), ("model", "stage"), axis_types=(AxisType.Explicit,) * 2)
    with jax.default_matmul_precision("highest"):
        step, args = pipeline.make_pipeline(
            cfg, params, mesh, tokens, targets, m, v=2, dropout=rate
        )
        (loss, _), grads = step(*args)

        def one_device(params, tokens, targets, key):
            def microbatch(tokens, key):
                def layer(x, weights_and_number):
                    weights, i = weights_and_number
                    new = transformer.block(x, weights, cfg, None)
                    mask_key = jax.random.fold_in(key, i)
                    return x + pipeline.dropped(new - x, mask_key, rate), None

                layers = (params["blocks"], jnp.arange(cfg.n_layers))
                return jax.lax.scan(layer, params["embed"][tokens], layers)[0]

            keys = jax.vmap(lambda j: jax.random.fold_in(key, j))(jnp.arange(m))
            y = jax.vmap(microbatch)(tokens, keys)
            y = transformer.rms_norm(y, params["final_norm"])
            return pipeline.cross_entropy(y, params["unembed"], targets, ())

        shaped = [a.reshape(m, micro, seq) for a in (tokens, targets)]
        ref_loss, ref_grads = jax.jit(jax.value_and_grad(one_device))(
            params, *shaped, jax.random.key(0)
        )
    plain = transformer.loss_fn(params, tokens, targets, cfg)
    assert abs(float(ref_loss) - float(plain)) > 1e-3  # the masks act
    chex.assert_trees_all_close(loss, ref_loss, rtol=1e-5)
    grads = {**grads, "blocks": jax.tree.map(pipeline.from_stages, grads["blocks"])}
    chex.assert_trees_all_close(grads, ref_grads, rtol=1e-5, atol=1e-6)


def test_dropout_on_a_data_axis_is_refused_until_rows_fold_in_their_index():
    import jax
    from jax.sharding import AxisType

    from book.lessons import transformer

    cfg = transformer.Config(n_layers=4)
    params = transformer.init_params(cfg)
    tokens = np.zeros((8, 8), np.int32)
    mesh = jax.make_mesh((2, 4), ("data", "stage"), axis_types=(AxisType.Explicit,) * 2)
    step, args = pipeline.make_pipeline(cfg, params, mesh, tokens, tokens, 4, dropout=0.1)
    with pytest.raises(AssertionError, match="fold in the data row"):
        step(*args)


@pytest.mark.parametrize("rate", [1.0, -0.5, float("nan")])
def test_a_dropout_rate_outside_zero_to_one_is_refused(rate):
    from book.lessons import transformer

    cfg = transformer.Config(n_layers=8)
    mesh = jax_mesh_of_stages()
    tokens = np.zeros((8, 8), np.int32)
    with pytest.raises(ValueError, match="dropout is a rate from 0 up to 1"):
        pipeline.make_pipeline(
            cfg, transformer.init_params(cfg), mesh, tokens, tokens, 4, dropout=rate
        )


def jax_mesh_of_stages():
    import jax
    from jax.sharding import AxisType

    return jax.make_mesh((8,), ("stage",), axis_types=(AxisType.Explicit,))


@pytest.mark.parametrize(
    "call, said",
    [
        (lambda: pipeline.one_f_one_b_order(2, 3, 5), "stage 5 of 2, 3 microbatches: no such work"),
        (lambda: pipeline.gpipe_order(2, 3, 5), "stage 5 of 2, 3 microbatches: no such work"),
        (lambda: pipeline.gpipe_order(2, -1, 0), "stage 0 of 2, -1 microbatches: no such work"),
        (lambda: pipeline.item(4, 3, 2, 2, True), "m = 3 is no multiple"),
        (lambda: pipeline.item(100, 4, 2, 2), "item 100 is not one of the 8 items"),
        (lambda: pipeline.item(-1, 4, 2, 2), "item -1 is not one of the 8 items"),
        (lambda: pipeline.item(8.0, 4, 2, 2), "item 8.0 must be a whole number"),
        (lambda: pipeline.item(np.float64(7.5), 4, 2, 2), "must be a whole number"),
        (lambda: pipeline.from_stages(np.arange(6).reshape(2, 3)), "as by_stage does"),
        (lambda: pipeline.schedule(2, 2.5), "positive whole numbers"),
        (lambda: pipeline.schedule(0, 4), "positive whole numbers"),
    ],
)
def test_schedule_helpers_refuse_arguments_out_of_range(call, said):
    with pytest.raises(ValueError, match=said):
        call()


def test_in_flight_counts_no_work_it_does_not_know():
    assert pipeline.in_flight([[("F", 0), None], [("B", 0), ("F", 0)]]).tolist() == [[1, 0], [0, 1]]
    with pytest.raises(KeyError):
        pipeline.in_flight([[("X", 0)]])


def test_schedule_takes_numpy_integers():
    assert pipeline.schedule(np.int64(4), np.int32(8)).shape == (4, 11)


@pytest.mark.parametrize("bad_id", [16, -1])
def test_ids_outside_the_vocabulary_are_nan_on_every_layout(bad_id):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rng = np.random.default_rng(0)
    y = jnp.asarray(rng.standard_normal((1, 2, 4, 8)), jnp.float32)
    unembed = jnp.asarray(rng.standard_normal((8, 16)), jnp.float32)  # 16 tokens
    table = jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 16, (1, 2, 4)), jnp.int32).at[0, 1, 2].set(bad_id)
    mesh = jax.make_mesh((2,), ("model",))
    by_vocab = NamedSharding(mesh, P(None, "model"))

    def split(f, specs):
        return jax.shard_map(f, mesh=mesh, in_specs=specs, out_specs=P())

    loss = split(
        lambda y, u, t: pipeline.cross_entropy(y, u, t, ("model",)), (P(), P(None, "model"), P())
    )
    assert np.isnan(float(pipeline.cross_entropy(y, unembed, targets, ())))
    assert np.isnan(float(loss(y, jax.device_put(unembed, by_vocab), targets)))
    ids = jnp.array([3, bad_id])
    rows = split(lambda t, k: pipeline.embed(t, k, ("model",)), (P("model"), P()))
    for found in (
        pipeline.embed(table, ids, ()),
        rows(jax.device_put(table, by_vocab.update(spec=P("model"))), ids),
    ):
        assert np.isfinite(np.asarray(found[0])).all() and np.isnan(np.asarray(found[1])).all()
