"""Each checker accepts a right answer and rejects plausible wrong ones, in one sentence."""

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

from book import exercises


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
    rejected(exercises.ch02_predict(None, None), "Not answered yet")


def test_ch02_rows_on_device_1():
    assert exercises.ch02_rows_on_device_1([2]).ok
    rejected(exercises.ch02_rows_on_device_1([1]), "'model' as the major axis")


def test_ch02_spec_for_64_bytes():
    for spec in (P("pipe", "data"), P(("data", "model")), P(None, ("pipe", "model"))):
        assert exercises.ch02_spec_for_64_bytes(spec).ok, spec
    rejected(exercises.ch02_spec_for_64_bytes(P("pipe")), "128 bytes per device")
    rejected(exercises.ch02_spec_for_64_bytes(P(("pipe", "data", "model"))), "32 bytes")
    rejected(exercises.ch02_spec_for_64_bytes("P('pipe', 'data')"), "not a P(...)")
    rejected(exercises.ch02_spec_for_64_bytes(P("pipe", "pipe")), "JAX cannot use")


def test_verdicts_render_as_one_line():
    verdict = exercises.ch02_predict((16, 1, 4), 1)
    assert repr(verdict).startswith("Correct: ") and "✔" in verdict._repr_html_()
