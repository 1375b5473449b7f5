"""The device choice, with injected environments and device lists: no accelerator exists here."""

import subprocess
import sys

import numpy as np
import pytest

from book import devices
from book.devices import Accelerator


def no_files(pattern):
    return False


@pytest.mark.parametrize(
    "env, files, expected",
    [
        ({}, set(), None),
        ({"COLAB_TPU_ADDR": "10.0.0.2:8470"}, set(), "tpu"),
        ({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, set(), "tpu"),
        ({}, {"/dev/accel[0-9]*"}, "tpu"),
        ({}, {"/dev/vfio/[0-9]*"}, "tpu"),
        ({}, {"/dev/nvidia[0-9]*"}, "gpu"),
    ],
)
def test_hint_reads_environment_and_device_files(env, files, expected):
    assert devices.accelerator_hint(env, files.__contains__) == expected


def test_no_hint_means_no_probe():
    def probe():
        raise AssertionError("the probe must not run without a hint")

    assert devices.detect_accelerator({}, no_files, probe) is None


def test_hint_runs_the_probe():
    found = devices.detect_accelerator({"TPU_NAME": "x"}, no_files, lambda: Accelerator("tpu", 8))
    assert found == Accelerator("tpu", 8)


@pytest.mark.parametrize(
    "accelerator, platform, count, mock, words",
    [
        (None, "cpu", 8, True, "no TPU or GPU was found"),
        (Accelerator("tpu", 8), "tpu", 8, False, "8 TPU devices"),  # Kaggle TPU v5e-8, TPU v3-8
        (Accelerator("gpu", 8), "gpu", 8, False, "8 GPU devices"),  # an 8-GPU node
        (Accelerator("tpu", 1), "cpu", 8, True, "1 TPU device, fewer than 8"),  # free Colab TPU
        (Accelerator("gpu", 1), "cpu", 8, True, "1 GPU device, fewer than 8"),  # Colab GPU
    ],
)
def test_choose(accelerator, platform, count, mock, words):
    plan = devices.choose(8, accelerator)
    assert (plan.platform, plan.count, plan.mock) == (platform, count, mock)
    assert words in plan.notice
    assert plan.notice.count(".") == 1 and "\n" not in plan.notice


def test_scaled_follows_the_platform():
    assert devices.scaled(64, 4096, devices.choose(8, None)) == 64
    assert devices.scaled(64, 4096, devices.choose(8, Accelerator("tpu", 8))) == 4096


def run_python(code):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def test_setup_gives_mock_devices_and_is_idempotent():
    rc, out = run_python(
        "import book.devices as d; d.setup(8); d.setup(8); import jax, os; "
        "print(jax.device_count(), jax.default_backend()); "
        "print(jax.config.read('jax_disable_most_optimizations'), "
        "os.environ['JAX_DISABLE_MOST_OPTIMIZATIONS'])"
    )
    assert rc == 0, out
    notice = [
        "Running on 8 mock CPU devices: no TPU or GPU was found.",
        "In a script of your own, these two lines before anything else uses JAX do the same:",
        '    jax.config.update("jax_platforms", "cpu")',
        '    jax.config.update("jax_num_cpu_devices", 8)',
        "and this optional one makes XLA compile tiny programs faster by optimizing them less:",
        '    jax.config.update("jax_disable_most_optimizations", True)',
    ]
    # Mock devices compile with little optimization, here and in the processes started from here.
    assert out.splitlines() == [*notice, *notice, "8 cpu", "True 1"]


def test_single_accelerator_falls_back_to_mock_cpu():
    rc, out = run_python(
        "import book.devices as d; from book.devices import Accelerator; "
        "d.setup(8, detect=lambda: Accelerator('tpu', 1)); import jax; "
        "print(jax.device_count(), jax.default_backend())"
    )
    assert rc == 0, out
    assert "fewer than 8" in out and out.splitlines()[-1] == "8 cpu"


def test_setup_after_jax_started_says_restart():
    rc, out = run_python(
        "import jax; jax.numpy.zeros(1); import book.devices as d\n"
        "try:\n    d.setup(8)\nexcept d.SetupError as e:\n    print('SAID:', e)"
    )
    assert rc == 0, out
    said = out.split("SAID: ")[1].strip()
    assert "restart the kernel" in said and said.count(".") == 1


def test_setup_with_another_count_says_restart():
    rc, out = run_python(
        "import book.devices as d; d.setup(8)\n"
        "try:\n    d.setup(4)\nexcept d.SetupError as e:\n    print('SAID:', e)"
    )
    assert rc == 0, out
    assert "restart the kernel to run with 4" in out


@pytest.mark.parametrize("bad", [0, -2, 2.5, "8", True, "²", None, [8]])
def test_setup_rejects_odd_counts(bad):
    with pytest.raises(devices.SetupError, match="positive whole number") as caught:
        devices.setup(bad)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("absurd", [2**31, 10**10000], ids=["2**31", "10**10000"])
def test_setup_refuses_absurd_counts_before_any_work(absurd):
    called = []
    with pytest.raises(devices.SetupError, match="too large") as caught:
        devices.setup(absurd, detect=lambda: called.append(1))
    assert not called and len(str(caught.value)) < 200


def test_setup_refuses_more_mock_devices_than_a_machine_holds():
    """Without accelerators the plan is mock CPU devices; 4096 of them are refused at once."""
    rc, out = run_python(
        "import book.devices as d\n"
        "try:\n    d.setup(4096, detect=lambda: None)\nexcept d.SetupError as e:\n"
        "    print('SAID:', e)"
    )
    assert rc == 0, out
    assert "SAID:" in out and "at most 512" in out


def test_setup_takes_a_numpy_integer():
    import numpy as np

    assert devices.setup(np.int64(8)).requested == 8  # the conftest's setup(8), repeated


def test_reader_errors_render_as_one_line():
    err = devices.SetupError("Restart the kernel.")
    assert err._render_traceback_() == ["SetupError: Restart the kernel."]


def test_chapters_that_time_programs_keep_full_optimization():
    rc, out = run_python(
        "import os; os.environ['JAX_DISABLE_MOST_OPTIMIZATIONS'] = '1'; "
        "import book.devices as d, jax; d.setup(8); d.set_fast_compiles(False); "
        "print(jax.config.read('jax_disable_most_optimizations'), "
        "'JAX_DISABLE_MOST_OPTIMIZATIONS' in os.environ)"
    )
    assert rc == 0, out
    assert out.splitlines()[-1] == "False False"


def test_fast_compiles_take_a_bool():
    with pytest.raises(devices.SetupError, match="must be True or False, not 'no'"):
        devices.set_fast_compiles("no")
    import jax

    before = jax.config.read("jax_disable_most_optimizations")
    devices.set_fast_compiles(np.bool_(before))  # a NumPy bool is a bool
    assert jax.config.read("jax_disable_most_optimizations") == before
    for wrong in (jax.random.key(0), {f"k{i}": i for i in range(10**4)}, ReprRaises(8)):
        with pytest.raises(devices.SetupError) as err:
            devices.set_fast_compiles(wrong)
        assert "\n" not in str(err.value) and len(str(err.value)) < 120, str(err.value)
    assert jax.config.read("jax_disable_most_optimizations") == before


class ReprRaises(int):
    def __repr__(self):
        raise RuntimeError("repr")


def test_compiling_fast_changes_no_program_the_chapters_read():
    """Chapter 1's claim: the flag skips backend work; the HLO, collectives and memory stay."""
    import re

    import jax
    import numpy as np

    from book.lessons import transformer as T

    cfg = T.Config()
    params, tokens = T.init_params(cfg), np.zeros((8, 16), np.int32)
    mesh = jax.make_mesh((4, 2), ("fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    step = T.make_step(cfg, T.Layout(mesh, T.RULES["FSDP x TP"]))
    before = jax.config.read("jax_disable_most_optimizations")
    seen = []
    try:
        for fast in (False, True):
            jax.config.update("jax_disable_most_optimizations", fast)
            jax.clear_caches()  # the flag is not in the compile cache's key
            compiled = step.lower(params, tokens, tokens).compile()
            memory = compiled.memory_analysis()
            seen.append(
                (
                    re.sub(r",? ?metadata=\{[^}]*\}", "", compiled.as_text()),
                    memory.temp_size_in_bytes,
                    memory.argument_size_in_bytes,
                    memory.output_size_in_bytes,
                )
            )
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
    assert "all-reduce" in seen[0][0] and seen[0] == seen[1]


def test_scaled_takes_a_plan_and_setup_a_detected_accelerator_only():
    with pytest.raises(devices.SetupError, match="plan must be what book.devices.setup"):
        devices.scaled(1, 2, plan="cpu")
    for found in ("gpu", devices.Accelerator("gpu", "8"), devices.Accelerator("npu", 8)):
        rc, out = run_python(
            "import book.devices as d\n"
            "from book.devices import Accelerator\n"
            "try:\n"
            f"    d.setup(8, detect=lambda: {found!r})\n"
            "except d.SetupError as err:\n"
            "    print('refused:', err)\n"
        )
        assert rc == 0 and "refused: detect returned" in out, out
