"""Each checker accepts a right answer and rejects plausible wrong ones, in one sentence."""

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from book import exercises, models
from book.errors import ReaderError


def rejected(verdict, words):
    assert not verdict.ok and words in verdict.message, verdict.message
    assert "\n" not in verdict.message


def test_ch01_chip_rows():
    def right(cores):
        return np.asarray(mesh_utils.create_device_mesh((8,), devices=cores)).reshape(4, 2)

    def id_order(cores):  # chips (1,0) then (0,1) on consecutive rows: no direct link
        return np.asarray(cores, dtype=object).reshape(4, 2)

    def split_chips(cores):
        ring = mesh_utils.create_device_mesh((8,), devices=cores)
        return np.roll(np.asarray(ring), 1).reshape(4, 2)

    assert exercises.ch01_chip_rows(right).ok
    rejected(exercises.ch01_chip_rows(id_order), "share no direct link")
    rejected(exercises.ch01_chip_rows(split_chips), "sit on different chips")
    rejected(exercises.ch01_chip_rows(lambda cores: None), "Not answered yet")
    rejected(exercises.ch01_chip_rows(lambda cores: np.asarray(cores)), "shape (8,)")
    lazily = lambda cores: (row for row in right(cores))  # noqa: E731 - rows, unread
    rejected(exercises.ch01_chip_rows(lazily), "chip_rows returned a generator; return")
    from book.devices import tpu_v3_8

    v3_8 = tpu_v3_8()  # the notebook's own cores, equal to the argument's, not the same objects
    assert exercises.ch01_chip_rows(lambda cores: right(v3_8)).ok
    twice = lambda cores: np.asarray([v3_8[0]] * 8, dtype=object).reshape(4, 2)  # noqa: E731
    rejected(exercises.ch01_chip_rows(twice), "each of the eight cores exactly once")


def test_ch01_reversed_mesh():
    def right(devices, types=(AxisType.Explicit,) * 3):
        grid = np.array(devices[::-1]).reshape(2, 2, 2)
        return Mesh(grid, ("pipe", "data", "model"), axis_types=types)

    def ordered(devices):
        return jax.make_mesh(
            (2, 2, 2), ("pipe", "data", "model"), axis_types=(AxisType.Explicit,) * 3
        )

    assert exercises.ch01_reversed_mesh(right).ok
    rejected(exercises.ch01_reversed_mesh(ordered), "it should be [7, 6, 5")
    rejected(exercises.ch01_reversed_mesh(lambda d: right(d, (AxisType.Auto,) * 3)), "axis_types")
    rejected(exercises.ch01_reversed_mesh(lambda d: 1 / 0), "raised ZeroDivisionError")


def test_ch02_predict():
    assert exercises.ch02_predict((16, 1, 4), 1).ok
    rejected(exercises.ch02_predict((16, 2, 4), 1), "4 x 2 = 8 ways")
    rejected(exercises.ch02_predict((16, 1, 4), 2), "Not 2 copies")
    rejected(exercises.ch02_predict((16, 1, 4, 1), 1), "has 4 entries; the array (16, 8, 4)")
    rejected(exercises.ch02_predict(None, None), "Not answered yet")


def test_ch02_rows_on_device_1():
    assert exercises.ch02_rows_on_device_1([2]).ok
    rejected(exercises.ch02_rows_on_device_1([1]), "'model' as the major axis")
    many = exercises.ch02_rows_on_device_1([8] * 10**6)  # named by its length, not printed
    rejected(many, "1,000,000 rows")
    assert len(many.message) < 300
    view = np.broadcast_to(np.int64(8), (10**12,))  # counted, not copied: MemoryError else
    rejected(exercises.ch02_rows_on_device_1(view), "1,000,000,000,000 numbers")


def test_ch02_spec_for_64_bytes():
    for spec in (P("pipe", "data"), P(("data", "model")), P(None, ("pipe", "model"))):
        assert exercises.ch02_spec_for_64_bytes(spec).ok, spec
    rejected(exercises.ch02_spec_for_64_bytes(P("pipe")), "128 bytes per device")
    rejected(exercises.ch02_spec_for_64_bytes(P(("pipe", "data", "model"))), "32 bytes")
    rejected(exercises.ch02_spec_for_64_bytes("P('pipe', 'data')"), "not a P(...)")
    rejected(exercises.ch02_spec_for_64_bytes(P("pipe", "pipe")), "JAX cannot use")
    if hasattr(P(), "unreduced"):  # chapter 4's partial sums: no placed array holds them
        unreduced = P("data", "model", unreduced={"pipe"})
        rejected(exercises.ch02_spec_for_64_bytes(unreduced), "names unreduced or reduced axes")


def test_verdicts_render_as_one_line():
    verdict = exercises.ch02_predict((16, 1, 4), 1)
    assert repr(verdict).startswith("Correct: ") and "✔" in verdict._repr_html_()


def test_ch03_no_communication():
    assert exercises.ch03_no_communication(P("data", None), P(None, "model")).ok
    assert exercises.ch03_no_communication(P("model"), P(None, "data")).ok
    both_split_k = exercises.ch03_no_communication(P("data", "model"), P("model", None))
    rejected(both_split_k, "all-reduce")
    rejected(exercises.ch03_no_communication(P("data"), P(None, "data")), "all-gather")
    rejected(exercises.ch03_no_communication(P(("data", "model")), P()), "whole of B")
    rejected(exercises.ch03_no_communication(P("data", "data"), P()), "JAX cannot place A")
    rejected(exercises.ch03_no_communication(None, None), "Not answered yet")


def test_ch03_gram():
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    rows = NamedSharding(mesh, P("x", None))

    def gathers_a(a):
        a = jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P()))
        return a.T @ a

    right = exercises.ch03_gram(jax.jit(lambda a: a.T @ a, out_shardings=rows))
    assert right.ok and "\n" not in right.message
    assert "dynamic-slice" in right.message  # the CPU compiler's reduce-scatter, quoted
    assert exercises.ch03_gram(lambda a: jax.lax.with_sharding_constraint(a.T @ a, rows)).ok
    rejected(exercises.ch03_gram(jax.jit(lambda a: a.T @ a)), "whole of a.T @ a")
    by_cols = jax.jit(lambda a: a.T @ a, out_shardings=NamedSharding(mesh, P(None, "x")))
    rejected(exercises.ch03_gram(by_cols), "split by columns")
    rejected(exercises.ch03_gram(jax.jit(gathers_a, out_shardings=rows)), "all-gathers")
    rejected(exercises.ch03_gram(lambda a: a @ a.T), "not a.T @ a")
    in_bf16 = jax.jit(lambda a: (a.T @ a).astype(jnp.bfloat16), out_shardings=rows)
    rejected(exercises.ch03_gram(in_bf16), "bfloat16, too coarse")  # not "the order"
    rejected(exercises.ch03_gram(lambda a: None), "Not answered yet")


def test_ch03_sum_groups():
    columns = [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert exercises.ch03_sum_groups(columns, P("model")).ok
    rejected(exercises.ch03_sum_groups([[0, 1, 2, 3], [4, 5, 6, 7]], P("model")), "rows of")
    rejected(exercises.ch03_sum_groups([[0, 4, 1, 5], [2, 6, 3, 7]], P("model")), "column")
    rejected(exercises.ch03_sum_groups(columns, P()), "split over 'model'")
    rejected(exercises.ch03_sum_groups(3, P()), "list of lists")
    rejected(exercises.ch03_sum_groups([*columns, []], P("model")), "holds an empty group")


def test_ch04_predict_types():
    right = (P("model", "data"), P("data", "model"), P("data", "model"))
    moving = {"concatenated", "sliced"}
    assert exercises.ch04_predict_types(*right, moving).ok
    assert exercises.ch04_predict_types(*right, ["sliced", "concatenated"]).ok
    rejected(exercises.ch04_predict_types(*right, {"concatenated"}), "moves data too")
    rejected(exercises.ch04_predict_types(*right, moving | {"transposed"}), "moves nothing")
    not_swapped = (P("data", "model"), *right[1:])
    rejected(exercises.ch04_predict_types(*not_swapped, moving), "x.T has type")
    rejected(exercises.ch04_predict_types(*right, {"sorted"}), "use names from")
    rejected(exercises.ch04_predict_types(*right, {b"sliced"}), "a set holding b'sliced'")
    rejected(exercises.ch04_predict_types(None, None, None, None), "Not answered yet")


def hidden(x, w1):
    return jnp.maximum(x @ w1, 0)


def test_ch04_mlp():
    def right(x, w1, w2):
        return jnp.matmul(hidden(x, w1), w2, out_sharding=P("data", None))

    def scattered(x, w1, w2):
        return jnp.matmul(hidden(x, w1), w2, out_sharding=P("data", "model"))

    def gathers_hidden(x, w1, w2):
        return jax.reshard(hidden(x, w1), P("data", None)) @ w2

    def gathers_w2(x, w1, w2):
        return hidden(x, w1) @ jax.reshard(w2, P())

    assert exercises.ch04_mlp(right).ok
    rejected(exercises.ch04_mlp(scattered), "still split over 'model'")
    rejected(exercises.ch04_mlp(gathers_hidden), "all-gathers the hidden activation")
    rejected(exercises.ch04_mlp(gathers_w2), "all-gathers w2")
    rejected(exercises.ch04_mlp(lambda x, w1, w2: hidden(x, w1) @ w2), "out_sharding=")
    no_relu = exercises.ch04_mlp(lambda x, w1, w2: jnp.matmul(x @ w1, w2, out_sharding=P("data")))
    rejected(no_relu, "values differ")
    in_bf16 = exercises.ch04_mlp(lambda x, w1, w2: right(x, w1, w2).astype(jnp.bfloat16))
    rejected(in_bf16, "bfloat16, too coarse")


def test_ch04_small_operand():
    def out_by_columns(a, v):
        return jnp.matmul(a, v, out_sharding=P(None, "data"))

    def out_by_rows(a, v):
        return jnp.matmul(a, v, out_sharding=P("data", None))

    assert exercises.ch04_small_operand(out_by_columns).ok
    assert exercises.ch04_small_operand(lambda a, v: jax.reshard(a, P()) @ v).ok
    rejected(exercises.ch04_small_operand(out_by_rows), "moves v")
    rejected(exercises.ch04_small_operand(lambda a, v: a @ jax.reshard(v, P())), "moves v")
    rejected(exercises.ch04_small_operand(lambda a, v: a @ v), "JAX cannot decide")
    rejected(exercises.ch04_small_operand(None), "Not answered yet")


# Chapters 07 to 09 -----------------------------------------------------------------------


def data_mesh():
    return jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))


def model_mesh():
    return jax.make_mesh((8,), ("model",), axis_types=(AxisType.Explicit,))


def example_losses(params, x, y):
    log_probs = jax.nn.log_softmax(models.forward(params, x), axis=-1)
    return -jnp.take_along_axis(log_probs, y[:, None], axis=-1)[:, 0]


def sum_dp(pcast=True, collective="psum", divide_by="batch", whole_batch=False):
    """The DP gradients of a summed loss, written right or with one of the usual mistakes."""

    def local(params, x, y):
        if pcast:
            params = jax.lax.pcast(params, "data", to="varying")
        total, grads = jax.value_and_grad(lambda p: example_losses(p, x, y).sum())(params)
        reduce = getattr(jax.lax, collective) if collective else (lambda t, axis: t)
        n = {"batch": x.shape[0] * jax.lax.axis_size("data"), "local": x.shape[0], "no": 1}
        return jax.tree.map(lambda t: reduce(t, "data") / n[divide_by], (total, grads))

    batch = P() if whole_batch else P("data")
    specs = (P(), batch, batch)

    def step(params, x, y):  # shard_map made as the function is traced, as readers write it
        return jax.shard_map(local, mesh=data_mesh(), in_specs=specs, out_specs=(P(), P()))(
            params, x, y
        )

    return step


def test_ch07_sum_dp():
    assert exercises.ch07_sum_dp(sum_dp()).ok
    assert exercises.ch07_sum_dp(sum_dp(collective="pmean", divide_by="local")).ok
    rejected(exercises.ch07_sum_dp(sum_dp(collective="pmean", divide_by="no")), "pmean divides")
    rejected(exercises.ch07_sum_dp(sum_dp(collective="pmean")), "already divided")
    rejected(exercises.ch07_sum_dp(sum_dp(divide_by="no")), "divide it by the global batch")
    rejected(exercises.ch07_sum_dp(sum_dp(divide_by="local")), "one device's 12 examples")
    rejected(exercises.ch07_sum_dp(sum_dp(pcast=False)), "without pcast")
    rejected(
        exercises.ch07_sum_dp(sum_dp(whole_batch=True)),
        "in_specs say P() for an input placed as P('data', None)",
    )
    rejected(exercises.ch07_sum_dp(sum_dp(collective=None)), "out_specs P() promises a value")
    rejected(exercises.ch07_sum_dp(lambda params, x, y: None), "Not answered yet")

    def complex_loss(params, x, y):
        loss, grads = sum_dp()(params, x, y)
        return loss + 0j, grads

    rejected(exercises.ch07_sum_dp(complex_loss), "The loss holds complex numbers; it should")

    def in_bfloat16(params, x, y):
        return jax.tree.map(lambda a: a.astype(jnp.bfloat16), sum_dp()(params, x, y))

    rejected(exercises.ch07_sum_dp(in_bfloat16), "is bfloat16, too coarse to compare")

    def swapped(params, x, y):
        loss, grads = sum_dp()(params, x, y)
        return grads, loss

    rejected(exercises.ch07_sum_dp(swapped), "returns (grads, loss); return them in the other")


def masked_dp(mean_of_means=False):
    def local(params, x, y, mask):
        params = jax.lax.pcast(params, "data", to="varying")
        if mean_of_means:
            loss_fn = lambda p: (example_losses(p, x, y) * mask).sum() / mask.sum()  # noqa: E731
            loss, grads = jax.value_and_grad(loss_fn)(params)
            return jax.lax.pmean((loss, grads), "data")
        total, grads = jax.value_and_grad(lambda p: (example_losses(p, x, y) * mask).sum())(params)
        count = jax.lax.psum(mask.sum(), "data")
        return jax.tree.map(lambda t: jax.lax.psum(t, "data") / count, (total, grads))

    specs = (P(), P("data"), P("data"), P("data"))
    return jax.shard_map(local, mesh=data_mesh(), in_specs=specs, out_specs=(P(), P()))


def test_ch07_masked_mean():
    assert exercises.ch07_masked_mean(masked_dp()).ok
    rejected(exercises.ch07_masked_mean(masked_dp(mean_of_means=True)), "mean of the 8 devices'")
    rejected(exercises.ch07_masked_mean(sum_dp()), "should take 4 arguments")
    rejected(exercises.ch07_masked_mean(lambda params, x, y, mask: None), "Not answered yet")


def fsdp(specs, gather_axis=-1, divide=True, all_reduce=False, gather_all=False):
    """An FSDP gradient step for parameters split as ``specs``, right or with a mistake."""

    def whole(shards):
        return {
            k: jax.lax.all_gather(s, "data", axis=gather_axis % s.ndim, tiled=True)
            if gather_all or specs[k] != P()
            else s
            for k, s in shards.items()
        }

    def local(shards, x, y):
        if all_reduce:  # gather first, differentiate the whole weights, cut the sum down
            full = {
                k: v if specs[k] != P() else jax.lax.pcast(v, "data", to="varying")
                for k, v in whole(shards).items()
            }
            loss, grads = jax.value_and_grad(models.loss)(full, x, y)
            grads = jax.lax.pmean(grads, "data")
            me = jax.lax.axis_index("data")
            for k, s in shards.items():
                if specs[k] != P():
                    dim = specs[k].index("data")
                    size = s.shape[dim]
                    grads[k] = jax.lax.dynamic_slice_in_dim(grads[k], me * size, size, dim)
            return jax.lax.pmean(loss, "data"), grads
        loss, grads = jax.value_and_grad(lambda s: models.loss(whole(s), x, y))(shards)
        if divide:
            grads = jax.tree.map(lambda g: g / jax.lax.axis_size("data"), grads)
        return jax.lax.pmean(loss, "data"), grads

    specs_in = (specs, P("data"), P("data"))

    def step(shards, x, y):
        mapped = jax.shard_map(local, mesh=data_mesh(), in_specs=specs_in, out_specs=(P(), specs))
        return mapped(shards, x, y)

    return step


COLUMNS = {"w1": P(None, "data"), "b1": P("data"), "w2": P(None, "data"), "b2": P("data")}
MIXED = {"w1": P("data"), "b1": P(), "w2": P("data"), "b2": P()}


def test_ch08_fsdp_columns():
    assert exercises.ch08_fsdp_columns(fsdp(COLUMNS)).ok
    rejected(exercises.ch08_fsdp_columns(fsdp(COLUMNS, divide=False)), "divide them by")
    rejected(exercises.ch08_fsdp_columns(fsdp(COLUMNS, gather_axis=0)), "the shape of no parameter")
    rejected(exercises.ch08_fsdp_columns(fsdp(COLUMNS, all_reduce=True)), "all-reduces")
    rejected(exercises.ch08_fsdp_columns(fsdp(MIXED)), "must be the inputs' own specs")
    rejected(exercises.ch08_fsdp_columns(lambda s, x, y: None), "Not answered yet")


def test_ch08_replicated_biases():
    assert exercises.ch08_replicated_biases(fsdp(MIXED, gather_axis=0)).ok
    rejected(exercises.ch08_replicated_biases(fsdp(MIXED, gather_axis=0, divide=False)), "8 times")
    gathers_biases = fsdp(MIXED, gather_axis=0, gather_all=True)
    rejected(exercises.ch08_replicated_biases(gathers_biases), "leave a replicated one")
    all_sharded = {k: P("data") for k in MIXED}
    rejected(exercises.ch08_replicated_biases(fsdp(all_sharded, gather_axis=0)), "own specs")
    wasteful = fsdp(MIXED, gather_axis=0, all_reduce=True)
    rejected(exercises.ch08_replicated_biases(wasteful), "all-reduces")


def two_layers(scatter=True, relu_first=False):
    def layer(partial):
        if scatter:
            return jax.lax.psum_scatter(partial, "model", scatter_dimension=1, tiled=True)
        whole = jax.lax.psum(partial, "model")
        size = whole.shape[1] // jax.lax.axis_size("model")
        return jax.lax.dynamic_slice_in_dim(whole, jax.lax.axis_index("model") * size, size, 1)

    def local(x, w1, w2):
        h = layer(jax.nn.relu(x @ w1)) if relu_first else jax.nn.relu(layer(x @ w1))
        return layer(h @ w2)

    specs = (P(None, "model"), P("model", None), P("model", None))
    return jax.shard_map(local, mesh=model_mesh(), in_specs=specs, out_specs=P(None, "model"))


def test_ch09_two_layers():
    assert exercises.ch09_two_layers(two_layers()).ok
    rejected(exercises.ch09_two_layers(two_layers(scatter=False)), "all-reduces")
    rejected(exercises.ch09_two_layers(two_layers(relu_first=True)), "partial sums")
    rejected(exercises.ch09_two_layers(lambda x, w1, w2: None), "Not answered yet")


MEGATRON = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}


def tp_block(mistake=None):
    def local(p, x):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        if mistake == "b2 inside":
            return x + jax.lax.psum(h @ p["w2"] + p["b2"], "model")
        if mistake == "gathers":
            h = jax.lax.all_gather(h, "model", axis=1, tiled=True)
            return x + h @ jax.lax.all_gather(p["w2"], "model", tiled=True) + p["b2"]
        return x + jax.lax.psum(h @ p["w2"], "model") + p["b2"]

    return jax.shard_map(
        local,
        mesh=model_mesh(),
        in_specs=(MEGATRON, P()),
        out_specs=P(),
        check_vma=mistake not in ("gathers", "no vma"),
    )


def test_ch09_megatron_block():
    assert exercises.ch09_megatron_block(tp_block()).ok
    rejected(exercises.ch09_megatron_block(tp_block("b2 inside")), "counts 8 times")
    rejected(exercises.ch09_megatron_block(tp_block("gathers")), "hidden activation leaves")
    rejected(exercises.ch09_megatron_block(tp_block("no vma")), "sums to be safe")
    rejected(exercises.ch09_megatron_block(lambda p, x: None), "Not answered yet")


def test_ch12_intensity_formula_is_what_xla_counts_on_cpu():
    cpu = jax.devices("cpu")[0]
    for m, k, n in exercises.INTENSITY_SHAPES:
        a, b = jnp.ones((m, k), jnp.float32, device=cpu), jnp.ones((k, n), jnp.float32, device=cpu)
        counts = jax.jit(jnp.matmul).lower(a, b).compile().cost_analysis()
        assert counts["flops"] / counts["bytes accessed"] == exercises.matmul_intensity(m, k, n)


def test_matmul_intensity_takes_whole_numbers_only():
    assert exercises.matmul_intensity(np.uint8(200), 200, 200) == exercises.matmul_intensity(
        200, 200, 200
    )  # read as a Python integer: uint8 arithmetic would overflow
    for bad in ("8", 8.5, None, np.int8(-1)):
        with pytest.raises(ReaderError):
            exercises.matmul_intensity(bad, 8, 8)


def test_ch12_intensity():
    from book import cost

    def right(m, k, n):
        return cost.matmul_flops(m, k, n) / (4 * (m * k + k * n + m * n))

    assert exercises.ch12_intensity(right).ok
    rejected(exercises.ch12_intensity(lambda m, k, n: right(m, k, n) / 2), "2 FLOPs")
    no_output = exercises.ch12_intensity(lambda m, k, n: 2 * m * k * n / (4 * (m * k + k * n)))
    rejected(no_output, "output's bytes are missing")
    rejected(exercises.ch12_intensity(lambda m, k, n: 4 * right(m, k, n)), "4 bytes")
    rejected(exercises.ch12_intensity(lambda m, k, n: None), "Not answered yet")


def _timer(warmup=2, wait=True, middle=statistics.median, runs=7, scale=1, clock=None):
    def seconds_per_call(f, *args):
        read = clock or time.perf_counter  # looked up at each call, as a reader's code does
        for _ in range(warmup):
            jax.block_until_ready(f(*args))
        times = []
        for _ in range(runs):
            start = read()
            out = f(*args)
            if wait:
                jax.block_until_ready(out)
            times.append((read() - start) * scale)
            jax.block_until_ready(out)
        return middle(times)

    return seconds_per_call


def test_ch12_timer():
    # Judged on a simulated clock, by what the timer does: no verdict depends on machine load.
    assert exercises.ch12_timer(_timer()).ok
    assert exercises.ch12_timer(_timer(middle=min)).ok  # the fastest run leaves it all out too
    rejected(exercises.ch12_timer(_timer(wait=False)), "timed the queueing")
    rejected(exercises.ch12_timer(_timer(middle=statistics.mean)), "not the mean")
    rejected(exercises.ch12_timer(_timer(warmup=0, middle=statistics.mean)), "first call's compile")
    rejected(exercises.ch12_timer(_timer(warmup=0)), "no untimed call")
    rejected(exercises.ch12_timer(_timer(runs=2)), "time several")
    rejected(exercises.ch12_timer(_timer(scale=1000)), "return seconds")
    rejected(exercises.ch12_timer(_timer(clock=time.process_time)), "reads no clock")
    rejected(exercises.ch12_timer(lambda f, *args: None), "Not answered yet")


NOTEBOOK_TIMER = """
import statistics
from time import perf_counter

import jax


def seconds_per_call(f, *args):
    jax.block_until_ready(f(*args))
    runs = []
    for _ in range(5):
        start = perf_counter()
        jax.block_until_ready(f(*args))
        runs.append(perf_counter() - start)
    return statistics.median(runs)
"""


def test_ch12_timer_follows_a_clock_imported_by_name():
    namespace = {}
    exec(NOTEBOOK_TIMER, namespace)  # as a notebook cell defines it, in the notebook's globals
    assert exercises.ch12_timer(namespace["seconds_per_call"]).ok
    assert namespace["perf_counter"] is time.perf_counter  # the real clock is back, both places


def test_ch12_dp_tp_bytes():
    from book import cost

    shard = (64 * 256 + 256 + 256 * 16) // 4 + 16
    right = cost.all_reduce_bytes(256 * 16 * 4, 4) + cost.all_reduce_bytes(shard * 4 + 4, 2)
    assert right == 45380
    assert exercises.ch12_dp_tp_bytes(right).ok
    assert exercises.ch12_dp_tp_bytes(right - 4).ok  # leaving out the loss is fine
    rejected(exercises.ch12_dp_tp_bytes(256 * 16 * 4 + shard * 4 + 4), "2(n-1)/n")
    full_batch = cost.all_reduce_bytes(512 * 16 * 4, 4) + cost.all_reduce_bytes(shard * 4 + 4, 2)
    rejected(exercises.ch12_dp_tp_bytes(full_batch), "half the batch")
    rejected(exercises.ch12_dp_tp_bytes(50000), "count two all-reduces")
    rejected(exercises.ch12_dp_tp_bytes(right / 2), "that is half")  # (n-1)/n, not 2(n-1)/n
    rejected(exercises.ch12_dp_tp_bytes(right * 2), "not those it also receives")
    rejected(exercises.ch12_dp_tp_bytes(None), "Not answered yet")


def read_once(batch, sharding):
    index_map = sharding.addressable_devices_indices_map(batch.shape)
    pieces, read = [], {}
    for device, index in index_map.items():
        key = index[0].indices(batch.shape[0])
        if key not in read:
            read[key] = batch.read(index)
        pieces.append(jax.device_put(read[key], device))
    return jax.make_array_from_single_device_arrays(batch.shape, sharding, pieces)


def test_ch10_read_once():
    def by_callback(batch, sharding):
        return jax.make_array_from_callback(batch.shape, sharding, batch.read)

    def whole(batch, sharding):
        return jax.device_put(batch.read(), sharding)

    def swapped(batch, sharding):
        index_map = sharding.addressable_devices_indices_map(batch.shape)
        pieces = [batch.read(index) for index in index_map.values()]
        pieces = pieces[2:] + pieces[:2]
        placed = [jax.device_put(p, d) for p, d in zip(pieces, index_map)]
        return jax.make_array_from_single_device_arrays(batch.shape, sharding, placed)

    assert exercises.ch10_read_once(read_once).ok
    rejected(exercises.ch10_read_once(by_callback), "each piece was read twice")
    rejected(exercises.ch10_read_once(whole), "the whole batch")
    rejected(exercises.ch10_read_once(swapped), "does not hold rows")
    rejected(exercises.ch10_read_once(lambda batch, sharding: None), "Not answered yet")


def padded_epoch(num_examples, global_batch, seed, epoch):
    import book.data

    order = book.data.epoch_order(num_examples, seed, epoch)
    steps = -(-num_examples // global_batch)
    padding = steps * global_batch - num_examples
    rows = np.concatenate([order, order[:padding]]).reshape(steps, global_batch)
    mask = (np.arange(steps * global_batch) < num_examples).reshape(steps, global_batch)
    return rows, mask


def test_ch10_padded_epoch():
    def dropped(num_examples, global_batch, seed, epoch):
        rows, mask = padded_epoch(num_examples, global_batch, seed, epoch)
        full = num_examples // global_batch
        return rows[:full], mask[:full]

    def unmasked(num_examples, global_batch, seed, epoch):
        rows, mask = padded_epoch(num_examples, global_batch, seed, epoch)
        return rows, np.ones_like(mask)

    def padded_first(num_examples, global_batch, seed, epoch):
        rows, mask = padded_epoch(num_examples, global_batch, seed, epoch)
        return rows[::-1], mask[::-1]

    def same_every_epoch(num_examples, global_batch, seed, epoch):
        return padded_epoch(num_examples, global_batch, seed, 0)

    assert exercises.ch10_padded_epoch(padded_epoch).ok
    rejected(exercises.ch10_padded_epoch(dropped), "never seen")
    rejected(exercises.ch10_padded_epoch(unmasked), "padding trains as real examples")
    rejected(exercises.ch10_padded_epoch(padded_first), "only the last batch")
    rejected(exercises.ch10_padded_epoch(same_every_epoch), "same order")
    rejected(exercises.ch10_padded_epoch(lambda n, b, s, e: None), "Not answered yet")
    swapped = lambda n, b, s, e: padded_epoch(n, b, s, e)[::-1]  # noqa: E731 - (mask, rows)
    rejected(exercises.ch10_padded_epoch(swapped), "returns (mask, rows); return them")


# The chapter 11 checkers copy these functions' source into worker processes, where jax, np,
# multihost_utils, NamedSharding, P and book are defined; the imports keep this module whole.


def column_means(local, mesh):
    from jax.experimental import multihost_utils

    x = multihost_utils.host_local_array_to_global_array(local, mesh, P("data"))
    means = jax.jit(lambda x: x.mean(axis=0), out_shardings=NamedSharding(mesh, P()))
    return means(x)


def own_means(local, mesh):
    return local.mean(axis=0)


def left_split(local, mesh):
    from jax.experimental import multihost_utils

    x = multihost_utils.host_local_array_to_global_array(local, mesh, P("data"))
    return jax.jit(lambda x: x / 16, out_shardings=NamedSharding(mesh, P("data")))(x)


def unanswered(local, mesh):
    # Build the global array here.
    return None


def undefined_name(local, mesh):
    return pandas.DataFrame(local).mean().to_numpy()  # noqa: F821


def means_as_text(local, mesh):
    return "mean"


def test_ch11_column_means():
    assert exercises.ch11_column_means(column_means).ok
    rejected(exercises.ch11_column_means(own_means), "its own 8 rows only")
    rejected(exercises.ch11_column_means(left_split), "cannot read the result")
    rejected(exercises.ch11_column_means(unanswered), "Not answered yet")
    rejected(exercises.ch11_column_means(lambda local, mesh: local), "not lambda")
    rejected(exercises.ch11_column_means(undefined_name), "import anything else inside it")
    rejected(exercises.ch11_column_means(means_as_text), "returned 'mean'; return the 3")


def own_rows(batch, sharding):
    return jax.make_array_from_callback(batch.shape, sharding, batch.read)


def one_block(batch, sharding):
    import book.data

    rows = book.data.process_slice(sharding, batch.shape)
    return jax.make_array_from_process_local_data(sharding, batch.read((rows,)), batch.shape)


def blocks_in_order(batch, sharding):
    """Also right: this process's blocks, read one by one and passed in the devices' order."""
    n = batch.shape[0]
    starts = sorted(
        {
            i[0].indices(n)[:2]
            for i in sharding.addressable_devices_indices_map(batch.shape).values()
        }
    )
    local = np.concatenate([batch.read((slice(*s),)) for s in starts])
    return jax.make_array_from_process_local_data(sharding, local, batch.shape)


def everything(batch, sharding):
    return jax.device_put(batch.read(), sharding)


def not_yet(batch, sharding):
    """Build the batch here."""
    pass


def test_ch11_own_rows():
    assert exercises.ch11_own_rows(own_rows).ok
    rejected(exercises.ch11_own_rows(one_block), "process_slice refuses this layout")
    assert exercises.ch11_own_rows(blocks_in_order).ok
    rejected(exercises.ch11_own_rows(everything), "held only by the other process's devices")
    rejected(exercises.ch11_own_rows(not_yet), "Not answered yet")


# Chapters 05 and 06: the reader's functions see the chapters' mesh, n, to_left and to_right.

n = 8
to_left = [(j, (j - 1) % n) for j in range(n)]
to_right = [(j, (j + 1) % n) for j in range(n)]


def on_i(fn, out_specs=None, check_vma=True):
    """``fn`` mapped over chapter 05's mesh, blocks split over 'i', joined as ``out_specs``."""
    mesh = jax.make_mesh((8,), ("i",), axis_types=(AxisType.Explicit,))
    out_specs = P("i") if out_specs is None else out_specs
    return jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=out_specs, check_vma=check_vma)


def ring_sum(steps=n - 1, perm=to_right):
    def local(block):
        acc, travelling = block, block
        for _ in range(steps):
            travelling = jax.lax.ppermute(travelling, "i", perm)
            acc = acc + travelling
        return acc

    return on_i(local)


def doubling(block):
    """Recursive doubling: 3 steps of ppermute, also an all-reduce from ppermute alone."""
    for s in (1, 2, 4):
        block = block + jax.lax.ppermute(block, "i", [(j, (j + s) % n) for j in range(n)])
    return block


def looped_ring_sum(block):
    """The ring of 7 steps as a fori_loop: the program lists its collective-permute once."""

    def step(_, carry):
        acc, travelling = carry
        travelling = jax.lax.ppermute(travelling, "i", to_right)
        return acc + travelling, travelling

    return jax.lax.fori_loop(0, n - 1, step, (block, block))[0]


def test_ch05_ring_sum():
    right = exercises.ch05_ring_sum(ring_sum())
    assert right.ok and "7 collective-permutes" in right.message, right.message
    looped = exercises.ch05_ring_sum(on_i(looped_ring_sum))
    assert looped.ok and "in a loop" in looped.message, looped.message
    assert exercises.ch05_ring_sum(on_i(doubling)).ok
    rejected(exercises.ch05_ring_sum(on_i(lambda b: jax.lax.psum(b, "i"))), "all-reduce")
    gathered = on_i(lambda b: jax.lax.all_gather(b, "i").sum(axis=0))
    rejected(exercises.ch05_ring_sum(gathered), "all-gather")
    rejected(exercises.ch05_ring_sum(ring_sum(steps=n - 2)), "never adds the block of position")
    rejected(exercises.ch05_ring_sum(ring_sum(steps=n)), "adds its own block twice")
    shift = [(j, j + 1) for j in range(n - 1)]
    rejected(exercises.ch05_ring_sum(ring_sum(perm=shift)), "close the ring")
    rejected(exercises.ch05_ring_sum(on_i(lambda b: b)), "only its own block")
    rejected(exercises.ch05_ring_sum(on_i(lambda b: None)), "Not answered yet")


def test_ch05_predict_all_to_all():
    ids = np.array([d.id for d in jax.make_mesh((8,), ("i",)).devices.flat])
    rows_np = 100 + 10 * ids[:, None] + np.arange(8)
    right = exercises.ch05_predict_all_to_all((8, 1), rows_np[:, 3:4])
    assert right.ok and "103, 113" in right.message, right.message
    assert exercises.ch05_predict_all_to_all([8, 1], list(rows_np[:, 3])).ok
    rejected(exercises.ch05_predict_all_to_all((1, 8), rows_np[:, 3]), "concat_axis=1")
    rejected(exercises.ch05_predict_all_to_all((8,), rows_np[:, 3]), "joins them along")
    rejected(exercises.ch05_predict_all_to_all((8, 1), rows_np[3]), "starts with")
    rejected(exercises.ch05_predict_all_to_all((8, 1), rows_np[:, 3][::-1]), "order of the")
    rejected(exercises.ch05_predict_all_to_all(None, None), "Not answered yet")


def from_position(k=5, mask=True):
    def local(block):
        mine = jax.lax.axis_index("i") == k
        return jax.lax.psum(jnp.where(mine, block, 0) if mask else block, "i")

    return local


def test_ch05_from_five():
    right = exercises.ch05_from_five(on_i(from_position(), P()))
    assert right.ok and "one all-reduce" in right.message, right.message
    rejected(exercises.ch05_from_five(on_i(from_position(mask=False), P())), "sum of all 8")
    rejected(exercises.ch05_from_five(on_i(from_position(4), P())), "position 4, not 5")
    rejected(exercises.ch05_from_five(on_i(from_position(), P("i"))), "out_specs=P()")

    def gathered(block):
        return jax.lax.all_gather(block, "i", to="invarying")[5]

    rejected(exercises.ch05_from_five(on_i(gathered, P())), "all-gathers")

    def relayed(block):  # position 5's block, passed on one hop at a time
        held = block
        for _ in range(n - 1):
            passed = jax.lax.ppermute(held, "i", to_right)
            held = jnp.where(jax.lax.axis_index("i") == 5, block, passed)
        return held

    rejected(exercises.ch05_from_five(on_i(relayed, P(), check_vma=False)), "ppermute")
    unshared = on_i(lambda b: jnp.where(jax.lax.axis_index("i") == 5, b, 0), P())
    rejected(exercises.ch05_from_five(unshared), "psum or pmean")
    rejected(exercises.ch05_from_five(on_i(lambda b: None, P())), "Not answered yet")


def ring_right(perm=to_right, sign=-1, offset=0, steps=n, gather=False):
    def matmul(a_blk, b_blk):
        if gather:
            return a_blk @ jax.lax.all_gather(b_blk, "x", tiled=True)
        me = jax.lax.axis_index("x")
        k = b_blk.shape[0]
        out = jnp.zeros((a_blk.shape[0], b_blk.shape[1]), a_blk.dtype)
        for step in range(steps):
            if step < n - 1:
                b_next = jax.lax.ppermute(b_blk, "x", perm)
            j = (me + sign * step + offset) % n
            out = out + jax.lax.dynamic_slice_in_dim(a_blk, j * k, k, axis=1) @ b_blk
            if step < n - 1:
                b_blk = b_next
        return out

    return matmul


def scanned_ring_right(a_blk, b_blk):
    """The ring to the right as a scan, its invariant initial carry cast to varying."""
    me = jax.lax.axis_index("x")
    k = b_blk.shape[0]

    def times(step, block):
        return jax.lax.dynamic_slice_in_dim(a_blk, ((me - step) % n) * k, k, axis=1) @ block

    def step(carry, s):
        out, block = carry
        return (out + times(s, block), jax.lax.ppermute(block, "x", to_right)), None

    out = jnp.zeros((a_blk.shape[0], b_blk.shape[1]), a_blk.dtype)
    out = jax.lax.pcast(out, "x", to="varying")
    (out, last), _ = jax.lax.scan(step, (out, b_blk), jnp.arange(n - 1))
    return out + times(n - 1, last)


def test_ch06_ring_right():
    right = exercises.ch06_ring_right(ring_right())
    assert right.ok and "7 collective-permutes" in right.message, right.message
    looped = exercises.ch06_ring_right(scanned_ring_right)
    assert looped.ok and "from a loop" in looped.message, looped.message
    rejected(exercises.ch06_ring_right(ring_right(to_left, sign=1)), "travel to the left")
    rejected(exercises.ch06_ring_right(ring_right(to_left)), "travel to the left")
    rejected(exercises.ch06_ring_right(ring_right(sign=1)), "device d - s started with")
    rejected(exercises.ch06_ring_right(ring_right(offset=-1)), "differ from A @ B")
    rejected(exercises.ch06_ring_right(ring_right(steps=n - 1)), "rows of all 8 devices")
    rejected(exercises.ch06_ring_right(ring_right(gather=True)), "all-gather")
    rejected(exercises.ch06_ring_right(lambda a, b: (a[:, :8] @ b).T), "shape (48, 40)")
    rejected(exercises.ch06_ring_right(lambda a, b: None), "Not answered yet")
    coarse = exercises.ch06_ring_right(lambda a, b: ring_right()(a, b).astype(jnp.bfloat16))
    rejected(coarse, "bfloat16, too coarse")  # a right ring, not a wrong index


def both_ways(meet=1, lefts=n // 2, swap=False):
    """Whole blocks both ways; ``meet`` is how often the block n // 2 away is added."""

    def matmul(a_blk, b_blk):
        me = jax.lax.axis_index("x")
        k = b_blk.shape[0]

        def times(j, block):
            return jax.lax.dynamic_slice_in_dim(a_blk, (j % n) * k, k, axis=1) @ block

        out = times(me, b_blk)
        left = right = b_blk
        for step in range(1, lefts + 1):
            left = jax.lax.ppermute(left, "x", to_left)  # block me + step
            if step < n // 2 or meet:
                out = out + times(me - step if swap else me + step, left)
        for step in range(1, n - lefts + (meet == 2)):
            right = jax.lax.ppermute(right, "x", to_right)  # block me - step
            out = out + times(me - step, right)
        return out

    return matmul


def test_ch06_both_ways():
    right = exercises.ch06_both_ways(both_ways())
    assert right.ok and "4 to the left and 3 to the right" in right.message, right.message
    assert exercises.ch06_both_ways(both_ways(lefts=3)).ok  # the longer way to the right
    rejected(exercises.ch06_both_ways(both_ways(meet=2)), "is added twice")
    rejected(exercises.ch06_both_ways(both_ways(meet=0)), "is never added")
    rejected(exercises.ch06_both_ways(both_ways(swap=True)), "its own columns of A")
    rejected(exercises.ch06_both_ways(ring_right(to_left, sign=1)), "All 7 collective-permutes")
    rejected(exercises.ch06_both_ways(both_ways(lefts=5)), "balance them")
    rejected(exercises.ch06_both_ways(lambda a, b: None), "Not answered yet")
    coarse = exercises.ch06_both_ways(lambda a, b: both_ways()(a, b).astype(jnp.float16))
    rejected(coarse, "float16, too coarse")


def test_right_answers_written_another_way_are_right():
    # A whole number as a float or a Decimal, groups as sets or an array, names as an array:
    # an answer is judged by its value.
    from decimal import Decimal

    for replication in (8 / 8, np.float32(1), jnp.bfloat16(1), Decimal(1)):
        assert exercises.ch02_predict((16, 1, 4), replication).ok
    assert exercises.ch02_predict(np.array([16.0, 1.0, 4.0]), 1).ok
    assert exercises.ch12_dp_tp_bytes(Decimal(45380)).ok
    columns = [[0, 4], [1, 5], [2, 6], [3, 7]]
    for groups in (
        [set(g) for g in columns],
        [range(g[0], g[1] + 1, 4) for g in columns],
        [np.array(g) for g in columns],
        jnp.array(columns),
    ):
        assert exercises.ch03_sum_groups(groups, P("model")).ok
    assert exercises.ch02_rows_on_device_1({2}).ok
    right = (P("model", "data"), P("data", "model"), P("data", "model"))
    for moving in (np.array(["sliced", "concatenated"]), {"sliced": 1, "concatenated": 2}.keys()):
        assert exercises.ch04_predict_types(*right, moving).ok
    rejected(exercises.ch21_stash_bytes(2**31, 2**29, jnp.bfloat16(7 / 39)), "too coarse")


def test_a_16_bit_intensity_is_called_too_coarse_not_wrong():
    def right(m, k, n):
        return 2 * m * k * n / (4 * (m * k + k * n + m * n))

    assert exercises.ch12_intensity(right).ok
    for kind in (np.float16, jnp.bfloat16):
        rejected(exercises.ch12_intensity(lambda m, k, n, t=kind: t(right(m, k, n))), "too coarse")


def test_a_timer_built_on_timeit_is_followed_and_share_keys_are_named():
    import statistics
    import timeit

    def seconds_per_call(f, *args):
        jax.block_until_ready(f(*args))
        runs = timeit.repeat(lambda: jax.block_until_ready(f(*args)), number=1, repeat=5)
        return statistics.median(runs)

    assert exercises.ch12_timer(seconds_per_call).ok
    assert timeit.Timer.__init__.__defaults__[2] is time.perf_counter  # put back
    rejected(exercises.ch12_dp_tp_bytes(jnp.bfloat16(45380)), "too coarse")


def test_sweep_27_right_answers_and_clear_sentences():
    def reversed_in_place(devices):
        devices.reverse()  # the list the checker passed: its own copy
        return Mesh(
            np.array(devices).reshape(2, 2, 2),
            ("pipe", "data", "model"),
            axis_types=(AxisType.Explicit,) * 3,
        )

    assert exercises.ch01_reversed_mesh(reversed_in_place).ok
    rejected(exercises.ch02_rows_on_device_1(np.ma.array([2], mask=[True])), "masked entries")

    def flops(s):
        return (6 * s.batch * s.features * s.hidden + 8 * s.batch * s.hidden * s.classes) * 1.1

    rejected(exercises.ch17_step_flops(flops), ".")
    assert "not 835584" not in exercises.ch17_step_flops(flops).message
