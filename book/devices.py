"""Choose the devices the book runs on, before the JAX backend starts.

Every chapter starts with ``book.devices.setup()``. With at least ``n`` accelerators present
(a Kaggle TPU v5e-8, a TPU v3-8 board, an 8-GPU node) the chapter runs on them; otherwise it runs
on ``n`` mock CPU devices, so every example works on a laptop or a single-chip Colab runtime.
The choice has to be made before JAX starts its backend, because the number of CPU devices and
the platform are fixed at that moment.
"""

from __future__ import annotations

import glob
import itertools
import os
import subprocess
import sys
from dataclasses import dataclass

from book import validate
from book.errors import ReaderError

_TPU_ENV_HINTS = ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID")
_DEVICE_FILE_HINTS = {
    "tpu": ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*"),
    "gpu": ("/dev/nvidia[0-9]*", "/dev/kfd"),
}
_PROBE = "import jax; print(jax.default_backend(), jax.device_count())"
# The oldest and the newest jax every chapter was executed with (pyproject's floor and
# requirements.txt's pin; a test keeps the three in step).
TESTED_JAX = ("0.10.0", "0.12.0.1")
# Mock CPU devices share this machine's cores and memory: 512 start in about a second, 4096 take
# a quarter of a minute and over a gigabyte before any work.
MAX_MOCK_DEVICES = 512


class SetupError(ReaderError, RuntimeError):
    """``setup`` cannot take effect any more because the JAX backend has already started."""


@dataclass(frozen=True)
class Accelerator:
    platform: str  # "tpu" or "gpu"
    count: int


@dataclass(frozen=True)
class Plan:
    """What ``setup`` decided: the platform, how many devices, and why."""

    requested: int
    platform: str  # "cpu", "tpu" or "gpu"
    count: int
    mock: bool
    notice: str


_plan: Plan | None = None


def accelerator_hint(env=None, exists=None) -> str | None:
    """Guess, from the environment and device files only, whether an accelerator may be present.

    This costs nothing, so machines without accelerators (laptops, CI) never pay for a probe.
    """
    env = os.environ if env is None else env
    exists = (lambda pattern: bool(glob.glob(pattern))) if exists is None else exists
    if any(env.get(name) for name in _TPU_ENV_HINTS):
        return "tpu"
    for platform, patterns in _DEVICE_FILE_HINTS.items():
        if any(exists(pattern) for pattern in patterns):
            return platform
    return None


def probe_accelerator(timeout: float = 180.0) -> Accelerator | None:
    """Ask a separate Python process which accelerator JAX sees and how many devices it has.

    A child process is used so that this process's backend is still free to be configured.
    """
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", JAX_PLATFORMS="")
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=True,
        ).stdout
        platform, count = out.split()[-2:]
        count = int(count)
    except (subprocess.SubprocessError, OSError, ValueError):
        return None
    return Accelerator(platform, count) if platform in ("tpu", "gpu") else None


def detect_accelerator(env=None, exists=None, probe=probe_accelerator) -> Accelerator | None:
    """The accelerator present, if any: a cheap hint first, the probe only when it says so."""
    if accelerator_hint(env, exists) is None:
        return None
    return probe()


def choose(n: int, accelerator: Accelerator | None) -> Plan:
    """Decide between real accelerators and ``n`` mock CPU devices."""
    if accelerator is not None and accelerator.count >= n:
        name = accelerator.platform.upper()
        return Plan(
            n,
            accelerator.platform,
            accelerator.count,
            False,
            f"Running on {accelerator.count} {name} devices.",
        )
    if accelerator is not None:
        name = accelerator.platform.upper()
        plural = "device" if accelerator.count == 1 else "devices"
        why = f"this runtime has {accelerator.count} {name} {plural}, fewer than {n}"
    else:
        why = "no TPU or GPU was found"
    devices = "device" if n == 1 else "devices"
    return Plan(n, "cpu", n, True, f"Running on {n} mock CPU {devices}: {why}.")


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: '0.12.1.dev20261101' -> (0, 12, 1)."""
    numbers = []
    for part in version.split("."):
        digits = "".join(itertools.takewhile(lambda c: c in "0123456789", part))[:12]
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) < len(part):
            break
    return tuple(numbers)


def version_notice(version: str, tested: tuple[str, str] = TESTED_JAX) -> str | None:
    """One sentence when ``version`` of jax lies outside the range the book was tested with.

    Colab and Kaggle keep their own jax, which may be older or newer; the chapters usually
    still run, so this informs rather than fails.
    """
    version = validate.text(version, "the jax version", example="'0.8.1'", error=SetupError)
    oldest, newest = tested
    if _release(oldest) <= _release(version) <= _release(newest):
        return None
    return (
        f"Note: this runtime has jax {version}; the book was tested with jax {oldest} to "
        f"{newest}, so an example may behave differently here."
    )


def setup(n: int = 8, *, detect=detect_accelerator) -> Plan:
    """Choose the devices for this kernel and configure JAX before its backend starts.

    Safe to call twice with the same ``n``. Called after JAX has started with other devices, it
    raises ``SetupError`` with one sentence: restart the kernel. On mock devices it also turns
    on ``set_fast_compiles``, which the chapters that time programs turn off again.
    """
    global _plan
    n = validate.whole(
        n,
        "The number of devices for setup",
        high=validate.MAX_DEVICES,
        too_large="more devices than any machine JAX runs on has",
        error=SetupError,
    )
    validate.callable_(detect, "detect", error=SetupError)
    if _plan is not None:
        if n != _plan.requested:
            raise SetupError(
                f"This kernel is already set up for {_plan.requested} devices; "
                f"restart the kernel to run with {n}."
            )
        print(_plan.notice)
        if _plan.mock:
            print(own_script_lines(n))
        return _plan
    import jax

    found = detect()
    if found is not None and not (
        isinstance(found, Accelerator)
        and found.platform in ("tpu", "gpu")
        and validate._is_whole(found.count)
        and not isinstance(found.count, bool)
    ):
        raise SetupError(
            f"detect returned {validate.describe(found)}; make it return None or an "
            "Accelerator such as Accelerator('gpu', 8)."
        )
    plan = choose(n, found)
    if plan.mock and n > MAX_MOCK_DEVICES:
        raise SetupError(
            f"Without {n} accelerators the book runs on mock CPU devices, and {n} of them would "
            f"only crowd this machine; ask for at most {MAX_MOCK_DEVICES}."
        )
    try:
        jax.config.update("jax_num_cpu_devices", n)
        if plan.mock:
            jax.config.update("jax_platforms", "cpu")
            set_fast_compiles(True)
    except RuntimeError:
        plan = _plan_from_running_backend(plan)
    _plan = plan
    print(plan.notice)
    if plan.mock:
        print(own_script_lines(n))
    notice = version_notice(jax.__version__)
    if notice:
        print(notice)
    return plan


def set_fast_compiles(on: bool) -> None:
    """Let XLA spend little effort optimizing (or, turned off, full effort), here and below.

    On mock devices the book's programs are tiny: compiling them takes far longer than running
    them, and most of a compile is LLVM optimizing code that then runs for microseconds. JAX's
    ``jax_disable_most_optimizations`` turns the backend's optimization level to 0; the graph
    passes that decide shardings, collectives and memory still run. The environment variable
    carries the choice to the workers and training runs a chapter starts, and is removed where
    a chapter times programs, so that a test runner's setting does not leak into them. On real
    accelerators setup leaves all this alone: there the run, not the compile, is what counts.
    """
    import jax

    on = validate.flag(on, "set_fast_compiles's argument", error=SetupError)
    jax.config.update("jax_disable_most_optimizations", on)
    if on:
        os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
    else:
        os.environ.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)


def own_script_lines(n: int) -> str:
    """What setup does for mock devices, as the lines a reader's own script needs.

    The chapters call ``setup``; a reader who copies a chapter into a script of their own needs
    these two configuration updates instead, before anything touches JAX's backend: without
    the first, a machine with one GPU still hands JAX that GPU alone. The third is optional.
    """
    return (
        "In a script of your own, these two lines before anything else uses JAX do the same:\n"
        '    jax.config.update("jax_platforms", "cpu")\n'
        f'    jax.config.update("jax_num_cpu_devices", {n})\n'
        "and this optional one makes XLA compile tiny programs faster by optimizing them less:\n"
        '    jax.config.update("jax_disable_most_optimizations", True)'
    )


def _plan_from_running_backend(plan: Plan) -> Plan:
    """Accept a backend that JAX already started if it has what the plan needs, else explain."""
    import jax

    devices = jax.devices()
    platform = devices[0].platform
    if platform == plan.platform and len(devices) >= plan.requested:
        return Plan(plan.requested, platform, len(devices), plan.mock, plan.notice)
    plural = "device" if len(devices) == 1 else "devices"
    raise SetupError(
        f"JAX already started with {len(devices)} {platform.upper()} {plural}, so it cannot "
        f"switch to {plan.count} {plan.platform.upper()} devices now; restart the kernel and run "
        "the setup cell before anything else."
    )


def current() -> Plan:
    """The plan ``setup`` made; chapters call ``setup`` first, so this is an error otherwise."""
    if _plan is None:
        raise SetupError("Run book.devices.setup() first, in the chapter's setup cell.")
    return _plan


def scaled(small, large, plan: Plan | None = None):
    """Pick a problem size for the platform: ``small`` on (mock) CPU, ``large`` on TPU/GPU.

    Mock CPU devices share a laptop's cores, so examples stay small there; real accelerators
    get sizes where parallelism is visible.
    """
    if plan is not None and not isinstance(plan, Plan):
        raise SetupError(
            f"plan must be what book.devices.setup returned, or None for the current one, not "
            f"{validate.describe(plan)}."
        )
    plan = current() if plan is None else plan
    return small if plan.platform == "cpu" else large


@dataclass(frozen=True)
class TpuCore:
    """The attributes ``jax.devices()`` reports for one TPU core, for lessons without a TPU."""

    id: int
    coords: tuple[int, int, int]
    core_on_chip: int
    platform: str = "tpu"
    device_kind: str = "TPU v3"
    process_index: int = 0


def tpu_v3_8() -> list[TpuCore]:
    """The eight cores of a TPU v3-8 board: 4 chips in a 2x2 grid, 2 cores each, in id order.

    These are the ids, chip coordinates and core numbers JAX reports on such a board, so
    ``mesh_utils.create_device_mesh`` orders them as it would the real devices.
    """
    chips = [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]
    return [TpuCore(2 * c + k, chips[c], k) for c in range(4) for k in range(2)]
