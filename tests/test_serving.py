"""Chapter 20: generation with a KV cache, book.sizing.serve, its form and its checkers."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from book import cost, exercises, sizing
from book.forms import serving as serving_form
from book.lessons import serving
from book.lessons.transformer import Config, Layout, forward, init_params

FAST = {"xla_backend_optimization_level": 0}
CFG = Config()
BATCH, PROMPT, NEW = 8, 8, 8


def rejected(verdict, words):
    assert not verdict.ok and words in verdict.message, verdict.message


@pytest.fixture(scope="module")
def case():
    params = init_params(CFG)
    prompts = np.random.default_rng(3).integers(0, CFG.vocab, (BATCH, PROMPT), np.int32)
    seq = np.zeros((BATCH, PROMPT + NEW), np.int32)
    seq[:, :PROMPT] = prompts
    full = jax.jit(lambda p, t: forward(p, t, CFG))
    for t in range(PROMPT, PROMPT + NEW):
        seq[:, t] = np.argmax(full(params, seq)[:, t - 1], axis=-1)
    return params, prompts, seq[:, PROMPT:]


@pytest.mark.parametrize("name", ["KV heads (TP)", "context (CP)"])
def test_a_sharded_cache_gives_the_tokens_and_the_plan(case, name):
    params, prompts, reference = case
    rules = serving.SERVING_RULES[name]
    (axis,) = serving.mesh_axes(rules)
    mesh = jax.make_mesh((8,), (axis,), axis_types=(AxisType.Auto,))
    run_prefill, run_decode = serving.serving_programs(
        CFG, Layout(mesh, rules), PROMPT + NEW, NEW - 1
    )
    run_prefill = run_prefill.lower(params, prompts).compile(FAST)
    first, cache = run_prefill(params, prompts)
    run_decode = run_decode.lower(params, first, cache, PROMPT).compile(FAST)
    plan, _ = serving.check_serving(
        CFG, name, run_prefill, run_decode, NEW - 1, params, cache
    )  # asserts memory and per-token bytes against the compiled programs
    rest, _ = run_decode(params, first, cache, PROMPT)
    assert (np.column_stack([first, rest]) == reference).all()
    assert plan.devices == 8


def test_cache_bytes_and_the_scaling_books_step():
    llama70 = sizing.PRESETS["Llama 3 70B"]
    assert sizing.kv_cache_bytes(llama70, 1, "int8") == 2 * 8 * 128 * 80
    p = sizing.serve(llama70, batch=32, context=8192, tp=8, param_dtype="int8", cache_dtype="int8")
    s = p.decode_seconds("TPU v5e")
    assert s.bound == s.memory and abs(s.bound - 0.017) < 5e-4 and abs(s.per_chip - 235) < 5
    assert p.memory["cache"] == sizing.kv_cache_bytes(llama70, 32 * 8192, "int8") // 8


def test_fsdp_gathers_every_layer_for_every_token():
    llama8 = sizing.PRESETS["Llama 3 8B"]
    fsdp = sizing.serve(llama8, batch=64, context=4096, fsdp=8).decode_seconds("H100")
    tp = sizing.serve(llama8, batch=64, context=4096, tp=8).decode_seconds("H100")
    assert fsdp.comm["fsdp"] > 10 * tp.comm["tp"]
    assert fsdp.bound == fsdp.comm["fsdp"]


def test_tp_layers_bytes_are_two_all_reduces_a_layer():
    m = sizing.PRESETS["Llama 3 8B"]
    p = sizing.serve(m, batch=16, context=1024, tp=4)
    layers = sum(c.sent * c.count for c in p.collectives if c.in_layers)
    assert layers == 2 * m.layers * cost.all_reduce_bytes(16 * m.d_model * 2, 4)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(batch=3, context=64, dp=2), "does not split evenly over dp x fsdp"),
        (dict(batch=2, context=64, tp=16), "a limit of the calculator, not of the chips"),
        (dict(batch=2, context=63, cp=2), "does not split evenly over cp=2"),
        (dict(batch=2, context=64, param_dtype="int4"), "param dtype"),
        (dict(batch=0, context=64), "batch"),
    ],
)
def test_bad_plans_are_refused_in_one_sentence(kwargs, words):
    with pytest.raises(sizing.SizingError, match=words):
        sizing.serve(sizing.PRESETS["Llama 3 8B"], **kwargs)


def test_a_chip_without_bandwidth_is_refused():
    hw = sizing.HARDWARE["H100"]
    bare = sizing.Hardware(hw.name, hw.peak_flops, hw.hbm_bytes, hw.fast, hw.slow, 8, "s")
    p = sizing.serve(sizing.PRESETS["Llama 3 8B"], batch=1, context=64)
    with pytest.raises(sizing.SizingError, match="has no HBM bandwidth"):
        p.decode_seconds(bare)
    with pytest.raises(sizing.SizingError, match="Pass one of"):
        p.decode_seconds("B200")


def test_the_form_answers_every_choice_without_raising():
    good = serving_form.render_serving("Llama 3 8B", "H100", "TP", "8", "32")
    assert "bk-viz bk-error" not in good and "tokens/s per user" in good
    for bad in [
        ("Llama 3 8B", "H100", "DP x TP", "12", "8"),
        ("Llama 9", "H100", "TP", "8", "8"),
        ("Llama 3 8B", "H100", "TP", "8", "many"),
    ]:
        assert "bk-viz bk-error" in serving_form.render_serving(*bad)
    assert "class='bk-data'" in serving_form.static_serving_explorer()


def test_checkers_accept_the_solutions_and_name_mistakes():
    llama70, hbm = sizing.PRESETS["Llama 3 70B"], sizing.HARDWARE["H100"].hbm_bytes
    batch = max(
        b
        for b in range(1, 200)
        if sizing.serve(llama70, batch=b, context=8192, tp=8).memory["total"] <= hbm
    )
    plan = sizing.serve(llama70, batch=batch, context=8192, tp=8)
    per_chip = plan.decode_seconds("H100").per_chip
    assert exercises.ch20_largest_batch(batch, per_chip).ok
    rejected(exercises.ch20_largest_batch(None, None), "Not answered yet")
    rejected(exercises.ch20_largest_batch(batch + 1, per_chip), "more than an H100's")
    rejected(exercises.ch20_largest_batch(batch - 1, per_chip), "find the largest")
    rejected(exercises.ch20_largest_batch(batch, 2 * per_chip), "per_chip")
    coarse = jax.numpy.bfloat16(per_chip)  # right, to bfloat16's three digits
    rejected(exercises.ch20_largest_batch(batch, coarse), "too coarse for the answer")
    rejected(exercises.ch20_largest_batch(batch, jax.numpy.bfloat16(2 * per_chip)), "not")
    right = 2 * CFG.n_layers * cost.all_reduce_bytes(64 * CFG.d_model * 4, 8)
    assert exercises.ch20_tp_token_bytes(right).ok
    rejected(exercises.ch20_tp_token_bytes(2 * right), "training step's four")
    rejected(exercises.ch20_tp_token_bytes(right / 8), "the chapter's batch of 8")
    rejected(exercises.ch20_tp_token_bytes(right / 2), "that is half")
    rejected(exercises.ch20_tp_token_bytes(right * 8 / 7), "not twice all of it")
    rejected(exercises.ch20_tp_token_bytes(None), "Not answered yet")


def test_serial_puts_each_collective_on_the_critical_path():
    llama70 = sizing.PRESETS["Llama 3 70B"]
    s = sizing.serve(llama70, batch=32, context=4096, tp=8).decode_seconds("H100")
    assert s.bound == s.memory < s.serial
    assert s.serial == pytest.approx(max(s.compute, s.memory) + sum(s.comm.values()))
    alone = sizing.serve(sizing.PRESETS["Llama 3 8B"], batch=8, context=4096)
    assert alone.decode_seconds("H100").serial == alone.decode_seconds("H100").bound


def test_the_chips_sources_say_which_reading_they_use():
    assert "8.1e11" in sizing.HARDWARE["TPU v5e"].source
    assert "96 GB" in sizing.HARDWARE["TPU v5p"].source
    for name in ("TPU v5e", "TPU v5p", "TPU v6e"):
        assert "scaling book" in sizing.HARDWARE[name].fast.source


def test_decoding_past_the_end_of_the_cache_is_refused_not_clamped():
    cfg = Config()
    params = jax.tree.map(jax.numpy.asarray, init_params(cfg))
    prompts = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
    token, cache = serving.prefill(params, prompts, 8, cfg)
    tokens, _ = serving.decode(params, token, cache, 4, 4, cfg)  # positions 4 to 7: room
    assert tokens.shape == (2, 4)
    for pos in (4, np.int64(4), jax.numpy.int32(4), np.array(4)):  # any concrete integer
        with pytest.raises(ValueError, match="a cache of 8 positions: no 5 steps from 4"):
            serving.decode(params, token, cache, pos, 5, cfg)
    with pytest.raises(ValueError, match="no 1 steps from -1"):  # before the start
        serving.decode(params, token, cache, -1, 1, cfg)
    for steps, pos in ((-1, 4), (True, 4), (2, 4.5)):  # not a count, not a position
        with pytest.raises(ValueError, match=f"no {steps} steps from {pos}"):
            serving.decode(params, token, cache, pos, steps, cfg)
    with pytest.raises(ValueError, match="a cache of 3 positions: no prompt of 4"):
        serving.prefill(params, prompts, 3, cfg)
    with pytest.raises(ValueError, match="no 9 steps from a traced position"):  # the length alone
        jax.jit(serving.decode, static_argnums=(4, 5))(params, token, cache, 4, 9, cfg)
    # under jit the position is traced: a call that would pass the end marks its tokens -1
    run = jax.jit(serving.decode, static_argnums=(4, 5))
    assert (np.asarray(run(params, token, cache, 7, 5, cfg)[0]) == -1).all()
    assert (np.asarray(run(params, token, cache, -1, 3, cfg)[0]) == -1).all()  # before it
    assert (np.asarray(run(params, token, cache, 4, 4, cfg)[0]) >= 0).all()


@pytest.mark.parametrize("bad_id", [64, 10**6, -1])
def test_a_prompt_holding_an_id_outside_the_vocabulary_decodes_to_minus_one(bad_id):
    cfg = Config()  # 64 tokens
    params = jax.tree.map(jax.numpy.asarray, init_params(cfg))
    prompts = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
    prompts[0, 2] = bad_id
    prefill = jax.jit(serving.prefill, static_argnums=(2, 3))
    first, cache = prefill(params, prompts, 8, cfg)
    assert int(first[0]) == -1 and int(first[1]) >= 0  # the other row is untouched
    rest, _ = jax.jit(serving.decode, static_argnums=(4, 5))(params, first, cache, 4, 3, cfg)
    assert (np.asarray(rest[0]) == -1).all() and (np.asarray(rest[1]) >= 0).all()


@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.int64])
def test_the_minus_one_mark_survives_any_integer_dtype(dtype):
    cfg = Config()
    params = jax.tree.map(jax.numpy.asarray, init_params(cfg))
    prompts = np.array([[1, 2, 64, 4], [5, 6, 7, 8]], dtype)  # 64: past the vocabulary
    first, cache = jax.jit(serving.prefill, static_argnums=(2, 3))(params, prompts, 8, cfg)
    assert first.tolist()[0] == -1
    run = jax.jit(serving.decode, static_argnums=(4, 5))
    assert (np.asarray(run(params, first, cache, 4, 3, cfg)[0][0]) == -1).all()
    given = jax.numpy.array([64, int(first[1])])  # a token past the vocabulary, given by hand
    assert (np.asarray(run(params, given, cache, 4, 3, cfg)[0][0]) == -1).all()


def test_decode_refuses_tokens_that_are_no_whole_numbers():
    from book.lessons import serving
    from book.lessons.transformer import Config, init_params

    cfg = Config()
    params = init_params(cfg)
    first, cache = serving.prefill(params, np.zeros((2, 3), np.int32), 8, cfg)
    with pytest.raises(ValueError, match="tokens are whole numbers, not float32"):
        serving.decode(params, first.astype(np.float32) + 0.7, cache, 3, 2, cfg)
