"""book.sizing.moe_all_to_all_bytes: hand counts, how the buffers scale, and refusals."""

import math

import numpy as np
import pytest

from book import cost, sizing

SMALL = {"top_k": 2, "d_model": 64, "experts": 4, "expert_parallel": 2, "dtype": "float32"}


def test_hand_count_of_a_small_layer():
    # 16 tokens, top-2 of 4 experts, 2 per device: a token may choose both of one device's
    # experts, so a dropless block has room for all 32 assignments, 32 rows of 64 float32
    # values, 8,192 bytes; each all-to-all sends the one block for the other device.
    dropless = sizing.moe_all_to_all_bytes(16, **SMALL)
    counts = 2 * 4  # the other device's two experts' counts, int32
    assert dropless == {"forward": 2 * 8192 + counts, "backward": 2 * 8192}
    # Capacity 1.25: ceil(1.25 * 2 * 16 / 4) = 10 rows per expert, 2 experts per block.
    capped = sizing.moe_all_to_all_bytes(16, **SMALL, capacity_factor=1.25)
    block = 2 * 10 * 64 * 4
    assert capped == {"forward": 2 * block + counts, "backward": 2 * block}


def test_one_device_on_the_expert_axis_sends_nothing():
    one = sizing.moe_all_to_all_bytes(4096, top_k=2, d_model=4096, experts=8, expert_parallel=1)
    assert one == {"forward": 0, "backward": 0}


@pytest.mark.parametrize("ep", [2, 4, 8, 16])
def test_dropless_buffers_grow_with_the_expert_axis_and_capacity_ones_do_not(ep):
    tokens, k, d, experts = 4096, 2, 1024, 64
    kw = {"top_k": k, "d_model": d, "experts": experts, "expert_parallel": ep}
    dropless = sizing.moe_all_to_all_bytes(tokens, **kw)["backward"]
    capped = sizing.moe_all_to_all_bytes(tokens, **kw, capacity_factor=1.25)["backward"]
    assignments = tokens * k * d * 2  # bfloat16, the default
    # Dropless: ep - 1 blocks of all assignments each way. Capacity: (ep - 1) / ep of
    # capacity_factor times the assignments (here 1.25 * 2 * 4096 / 64 = 160 rows exactly).
    assert dropless == pytest.approx(2 * (ep - 1) * assignments)
    assert capped == pytest.approx(2 * (ep - 1) / ep * 1.25 * assignments)
    assert dropless / capped == pytest.approx(ep / 1.25)


@pytest.mark.parametrize("ep", [16, 32, 64])
def test_a_device_gets_at_most_min_of_top_k_and_its_experts_per_token(ep):
    # A token's top_k experts are distinct: with fewer experts per device than top_k, a block
    # needs only tokens x experts-per-device rows. The buffer a device receives, ep blocks, is
    # then MaxText's worst case: min(ep, experts / top_k) times the balanced top_k x tokens.
    tokens, k, d, experts = 4096, 4, 1024, 64
    kw = {"top_k": k, "d_model": d, "experts": experts, "expert_parallel": ep}
    got = sizing.moe_all_to_all_bytes(tokens, **kw)["backward"]
    rows = min(k, experts // ep) * tokens
    assert got == pytest.approx(2 * (ep - 1) * rows * d * 2)
    assert ep * rows == min(ep, experts / k) * k * tokens


def test_ragged_sends_what_a_balanced_router_routes():
    # 16 tokens, top-2, 2 devices: 32 assignments, half of them to the other device, 16 rows
    # of 64 float32 values each way; the counts travel as before.
    ragged = sizing.moe_all_to_all_bytes(16, **SMALL, ragged=True)
    assert ragged == {"forward": 2 * 4096 + 2 * 4, "backward": 2 * 4096}
    for ep in (2, 8, 64):
        kw = {"top_k": 2, "d_model": 4096, "experts": 64, "expert_parallel": ep}
        sent = sizing.moe_all_to_all_bytes(8192, **kw, ragged=True)["backward"]
        assert sent == pytest.approx(2 * (ep - 1) / ep * 2 * 8192 * 4096 * 2)
        assert sent < sizing.moe_all_to_all_bytes(8192, **kw, capacity_factor=1.25)["backward"]


def test_the_formula_is_book_costs_all_to_all():
    got = sizing.moe_all_to_all_bytes(24, **SMALL, capacity_factor=1.1)
    rows = 2 * math.ceil(1.1 * 2 * 24 / 4)
    buffer = 2 * rows * 64 * 4  # one device's buffer: a block for each device
    assert got["backward"] == 2 * cost.all_to_all_bytes(2 * buffer, 2)


def test_numpy_numbers_are_numbers():
    kw = {k: np.int64(v) if isinstance(v, int) else v for k, v in SMALL.items()}
    assert sizing.moe_all_to_all_bytes(np.int32(16), **kw, capacity_factor=np.float32(1.25)) == (
        sizing.moe_all_to_all_bytes(16, **SMALL, capacity_factor=1.25)
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"tokens": 0}, "tokens must be a positive whole number"),
        ({"tokens": True}, "tokens must be a positive whole number"),
        ({"top_k": 5}, "more than the 4 experts"),
        ({"experts": 6, "expert_parallel": 4}, "do not split evenly"),
        ({"d_model": 64.0}, "d_model must be a positive whole number"),
        ({"capacity_factor": 0}, "more than 0"),
        ({"capacity_factor": -1.25}, "more than 0"),
        ({"capacity_factor": math.nan}, "finite"),
        ({"capacity_factor": math.inf}, "finite"),
        ({"capacity_factor": "1.25"}, "or None for dropless"),
        ({"capacity_factor": 1e300}, "too large"),
        ({"dtype": "int4"}, "not a dtype here"),
        ({"expert_parallel": 2**40}, "too large"),
        ({"ragged": "True"}, "True or False"),
        ({"ragged": True, "capacity_factor": 1.25}, "leave capacity_factor at None"),
    ],
)
def test_bad_numbers_are_refused_in_one_sentence(change, words):
    kw = {"tokens": 16, **SMALL, **change}
    with pytest.raises(sizing.SizingError, match=words) as err:
        sizing.moe_all_to_all_bytes(kw.pop("tokens"), **kw)
    message = str(err.value)
    assert "\n" not in message and message.endswith(".") and message.count(". ") == 0
