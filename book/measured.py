"""What one real GPU measured, stored with its provenance: chapters 12, 17 and 18 read it.

The chapters run on whatever devices the reader has, mock CPU devices mostly; what only an
accelerator can show (a matrix product near the chip's peak, HBM bandwidth, a training step's
MFU, its kernels) was measured once by ``benchmarks/bench_gpu.py`` and stored in
``measurements/gpu.json``, with the profiled step's trace beside it. Nothing here measures:
the book's build reads the stored numbers and says where and when they were taken.
"""

from __future__ import annotations

import json
import math
import stat
from dataclasses import dataclass
from pathlib import Path

from book import cost, sizing, validate
from book.devices import TESTED_JAX
from book.errors import ReaderError
from book.lessons.planning import small_model
from book.lessons.transformer import Config

FOLDER = Path(__file__).parent / "measurements"
RESULTS, TRACE = FOLDER / "gpu.json", FOLDER / "gpu_trace.json.gz"
MAX_BYTES = 2**24  # far more than bench_gpu.py writes
STEP = FOLDER / "gpu_step.hlo.gz"  # the profiled step as XLA compiled it, gzipped HLO text
# Kernels whose names mark them as matrix products: cuBLAS's (nvjet_* on Hopper, *gemm*
# elsewhere), CUTLASS's, and XLA's own Triton GEMM fusions (gemm_fusion_dot*).
MATMUL_KERNELS = ("nvjet", "gemm", "cutlass")
# Dense float32 peaks, published beside the bfloat16 one that book.sizing holds: TF32 on
# the tensor cores (the datasheet's 989 TFLOP/s is "with sparsity", twice the dense rate)
# and plain FP32. https://www.nvidia.com/en-us/data-center/h100/ (the H200 page gives the same)
FLOAT32_PEAKS = {
    "H100": {"default": 494.5e12, "HIGHEST": 67e12},
    "H200": {"default": 494.5e12, "HIGHEST": 67e12},
}
PEAK_NAMES = {"default": "TF32", "HIGHEST": "FP32"}
# The devices (JAX's device_kind, lower case) whose peaks these are: the SXM parts only, not
# the H100 PCIe or NVL, nor the GH200.
DEVICE_CHIPS = {"nvidia h100 80gb hbm3": "H100", "nvidia h200": "H200"}


class MeasurementError(ReaderError, ValueError):
    """A file that is not a finished accelerator run, explained in one sentence."""


@dataclass(frozen=True)
class Measurement:
    """The stored results of one run of ``benchmarks/bench_gpu.py`` on an accelerator."""

    data: dict

    @property
    def device(self) -> str:
        return self.data["kernels"]["device_kind"]

    @property
    def provenance(self) -> str:
        """Where, when and with what the numbers were measured, in one line."""
        m = self.data["machine"]
        smi = m.get("nvidia_smi") or ""
        driver = f", driver {smi.split(', ')[1]}" if smi.count(", ") >= 1 else ""
        libraries = m.get("libraries", {})
        cublas = f", cuBLAS {libraries['nvidia-cublas']}" if "nvidia-cublas" in libraries else ""
        pinned = TESTED_JAX[1]
        other = f" (the book pins jax {pinned})" if m["jax"] != pinned else ""
        return (
            f"Measured on one {self.device}{driver}, jax {m['jax']}{other}{cublas}, "
            f"{m['date']}, by benchmarks/bench_gpu.py; stored, not re-run by this page."
        )

    @property
    def hardware(self) -> sizing.Hardware:
        """book.sizing's published figures for this chip."""
        return sizing.HARDWARE[self.data["machine"]["peaks"]["chip"]]

    def matmuls(self) -> list[dict]:
        """Each timed k x k x k product: dtype, k, precision, TFLOP/s, share of its peak.

        FLOPs are the textbook's 2k³: XLA's cost analysis reports none (-1) for the products
        it hands to cuBLAS, so its count cannot be used here. Each rate is the fastest run's,
        set against the published dense peak for how the product ran: bfloat16's, TF32's for
        float32 at JAX's default precision on this GPU, FP32's for ``precision=HIGHEST``.
        """
        rows = []
        for r in self.data["kernels"]["rows"]:
            if r["kernel"].startswith("matmul"):
                k = r["shape"][0]
                flops = cost.matmul_flops(k, k, k) / r["best_s"]
                precision = "HIGHEST" if "HIGHEST" in r["kernel"] else "default"
                if r["dtype"] == "bfloat16":
                    peak, name = self.hardware.peak_flops, "bfloat16"
                elif r["dtype"] != "float32":  # bench_gpu.py times these two only
                    raise ValueError(f"no peak for a {r['dtype']} product")
                else:
                    peak = FLOAT32_PEAKS[self.hardware.name][precision]
                    name = PEAK_NAMES[precision]
                rows.append(
                    {
                        "dtype": r["dtype"],
                        "k": k,
                        "precision": precision,
                        "counted_by_xla": r["flops"] is not None,
                        "seconds": r["best_s"],
                        "median_seconds": r["median_s"],
                        "tflops": flops / 1e12,
                        "peak_name": name,
                        "peak_tflops": peak / 1e12,
                        "of_peak": flops / peak,
                    }
                )
        return rows

    def streams(self) -> list[dict]:
        """Each timed elementwise kernel: bytes moved (XLA's count), GB/s, share of HBM's."""
        rows = []
        for r in self.data["kernels"]["rows"]:
            if not r["kernel"].startswith("matmul"):
                rate = r["bytes"] / r["best_s"]
                rows.append(
                    {
                        "kernel": r["kernel"],
                        "dtype": r["dtype"],
                        "elements": r["shape"][0],
                        "bytes": r["bytes"],
                        "seconds": r["best_s"],
                        "gbps": rate / 1e9,
                        "of_peak": rate / self.hardware.hbm_bandwidth,
                    }
                )
        return rows

    def model(self) -> sizing.Transformer:
        """The trained model's shape, as book.sizing counts it (chapter 13's GELU MLP)."""
        return small_model(Config(**self.data["train"]["model"]))

    def step(self) -> dict:
        """Chapter 19's step at this size: seconds, tokens per second, MFU, peak memory.

        MFU counts the model's FLOPs as book.sizing does: 6 per weight of the matrix products
        and token, and attention's causal half of the scores.
        """
        t = self.data["train"]
        flags = t["flags"]
        flag = {name: _whole(value) for name, value in zip(flags[::2], flags[1::2])}  # last wins
        return {
            "parameters": t["parameters"],
            "batch": flag["--batch"],
            "seq": flag["--seq"],
            "microbatches": flag["--microbatches"],
            "seconds": t["median_step_s"],
            "tokens_per_second": t["tokens_per_second"],
            "model_flops": t["model_flops_per_step"],
            "mfu": t["model_flops_per_step"] / t["median_step_s"] / self.hardware.peak_flops,
            "peak_memory_bytes": t["memory_bytes"]["peak_memory_in_bytes"],
        }


@validate.impostors_refused
def kernel_kind(name: str) -> str:
    """A GPU kernel's kind, read from its name: 'matmul', 'copy', 'scatter' or 'other'."""
    name = validate.text(
        name,
        "a kernel's name",
        example="'nvjet_sm90_tst'",
        empty=True,
        limit=10**4,
        error=MeasurementError,
    )
    if any(mark in name for mark in MATMUL_KERNELS):
        return "matmul"
    if name.startswith("memcpy"):
        return "copy"
    return "scatter" if "scatter" in name else "other"


@validate.impostors_refused
def load(path: Path = RESULTS) -> Measurement | None:
    """The stored measurement, or None where the stored file is absent (an old install).

    Another file, such as the ``--out`` of a run of one's own, must hold a finished run on an
    accelerator whose peaks book.sizing has: anything else is refused here in one sentence
    rather than failing later in a method.
    """
    given = path
    path = validate.path(path, "The path", "the --out of bench_gpu.py", error=MeasurementError)
    shown = validate.describe(str(path), 120)
    try:
        found = path.stat()  # a pipe or /dev/zero would be read forever, a run is 14 kB
        if not stat.S_ISREG(found.st_mode) or found.st_size > MAX_BYTES:
            why = "not a regular file" if not stat.S_ISREG(found.st_mode) else "too large"
            raise MeasurementError(f"{shown} cannot be read as JSON ({why}).")
        data = json.loads(path.read_text())
    except MeasurementError:
        raise
    except FileNotFoundError:
        if given is RESULTS:
            return None
        raise MeasurementError(f"There is no file {shown}; check the path.") from None
    except (OSError, ValueError, RecursionError) as err:  # a folder, not UTF-8, not JSON
        why = getattr(err, "strerror", None) or type(err).__name__
        raise MeasurementError(f"{shown} cannot be read as JSON ({why}).") from None
    parts = data if isinstance(data, dict) else {}
    unfinished = [
        part
        for part in ("machine", "kernels", "train")
        if not isinstance(parts.get(part), dict) or "error" in parts[part]
    ]
    if unfinished or not isinstance(parts["machine"].get("peaks"), dict):
        raise MeasurementError(
            f"{shown} holds no finished run of benchmarks/bench_gpu.py on an accelerator book."
            f"sizing has peaks for ({', '.join(unfinished) or 'peaks'} missing or failed)."
        )
    chip = parts["machine"]["peaks"].get("chip")  # None: a GPU without a table entry, or --dry
    if not (isinstance(chip, str) and chip in FLOAT32_PEAKS):
        device = validate.describe(parts["kernels"].get("device_kind"))
        raise MeasurementError(
            f"{shown} holds a run on {device}, a device whose peaks book.sizing does not have; "
            f"the book reads runs on {' or '.join(FLOAT32_PEAKS)} only."
        )
    device = parts["kernels"].get("device_kind")
    if not isinstance(device, str) or not device.strip():
        raise MeasurementError(
            f"{shown} names no device it ran on (kernels.device_kind is "
            f"{validate.describe(device)}); run benchmarks/bench_gpu.py again, or load the "
            "stored one."
        )
    named = DEVICE_CHIPS.get(device.lower())
    if named != chip:
        raise MeasurementError(
            f"{shown} holds {chip}'s peaks for a run on {validate.describe(device)}; run "
            "benchmarks/bench_gpu.py again, or load the stored one."
        )
    found = Measurement(data)
    try:  # read once here, so a file edited by hand fails now, not in a chapter's table
        read = [found.provenance, found.matmuls(), found.streams(), found.model(), found.step()]
    except Exception as err:  # noqa: BLE001 - any field missing or of the wrong kind
        raise MeasurementError(
            f"{shown} is not a run as benchmarks/bench_gpu.py writes it ({type(err).__name__} "
            "reading its fields); run it again, or load the stored one."
        ) from None
    odd = next((v for v in _numbers(read) if not _plain_number(v)), None)
    odd = next(_not_numbers(read), odd)
    if odd is None:
        _, matmuls, streams, _, step = read
        if not matmuls or not streams:
            raise MeasurementError(
                f"{shown} holds no timed matrix products or streams (kernels.rows); run "
                "benchmarks/bench_gpu.py again, or load the stored one."
            )
        timed = [r for r in matmuls if r["seconds"] > r["median_seconds"]]
        if timed or min(step["batch"], step["seq"], step["microbatches"]) < 1:
            raise MeasurementError(
                f"{shown} holds a run no benchmark gives (a fastest time above its median, or "
                "a batch, length or microbatch count below 1); run it again, or load the "
                "stored one."
            )
    if odd is not None:  # JSON allows NaN; a time, size or rate is never negative
        raise MeasurementError(
            f"{shown} holds {validate.describe(odd, 40)}, which no time, size, count or rate "
            "of a run is; run it "
            "again, or load the stored one."
        )
    return found


def _whole(value) -> int:
    """A flag's value as bench_gpu.py writes it, a whole number or its text; else ValueError
    (True or 32.7 would read as 1 or 32), which load turns into its sentence."""
    if isinstance(value, bool) or not (isinstance(value, int) or str(value).isdigit()):
        raise ValueError(f"not a whole number: {value!r}")
    return int(value)


FLAGS = {"counted_by_xla"}  # the only true-or-false fields the methods return
TEXTS = {"dtype", "precision", "peak_name", "kernel"}  # the only text they return


def _not_numbers(value):
    """Each value the methods return where a number belongs that is none (a text, a list)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key not in FLAGS | TEXTS and not isinstance(item, (int, float, dict, list)):
                yield item
            yield from _not_numbers(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _not_numbers(item)


def _plain_number(value) -> bool:
    """A time, size, count or rate: a finite number, not negative (nor true or false)."""
    if isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value)) and value >= 0
    except OverflowError:  # an integer past any float, as 10**400
        return False


def _numbers(value):
    """Every number in what a run's methods read, however nested, and every true or false
    where a number belongs (JSON's ``true`` reads as 1): all but the methods' own flags."""
    if isinstance(value, str) or value is None:
        return
    if isinstance(value, (int, float)):  # bool included
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key not in FLAGS:
                yield from _numbers(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _numbers(item)
