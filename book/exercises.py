"""Checkers for the exercises at the end of each chapter.

Each checker takes what the reader wrote (a function, a spec, a number), tries it on fresh inputs
and compares it with a reference the way a reviewer would: values, shardings and, where the
exercise is about communication, the compiled program. It answers with a ``Verdict``: one
friendly sentence saying what is right or what is wrong. It never raises, whatever the reader's
code does.
"""

from __future__ import annotations

import functools
import html
import traceback
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Verdict:
    """A checker's answer: whether the exercise is solved, and one sentence why."""

    ok: bool
    message: str

    def _repr_html_(self):
        colour, mark = ("#1e7b34", "✔") if self.ok else ("#a33", "✘")
        return (
            f"<div style='border-left:4px solid {colour};padding:4px 10px;margin:4px 0'>"
            f"<b style='color:{colour}'>{mark}</b> {html.escape(self.message)}</div>"
        )

    def __repr__(self):
        return ("Correct: " if self.ok else "Not yet: ") + self.message


class _Wrong(Exception):
    """Raised inside a checker to stop at the first problem with the reader's answer."""


def _checker(func):
    """Turn a checker that raises ``_Wrong`` into one that always returns a ``Verdict``."""

    @functools.wraps(func)
    def check(*args, **kwargs):
        try:
            return Verdict(True, func(*args, **kwargs))
        except _Wrong as wrong:
            return Verdict(False, str(wrong))
        except Exception as err:  # the reader's code failed: say where, briefly
            frame = traceback.extract_tb(err.__traceback__)[-1]
            return Verdict(
                False,
                f"Your code raised {type(err).__name__} ({str(err).splitlines()[0][:120]}) "
                f"at line {frame.lineno}; fix that and check again.",
            )

    return check


def _need(condition, message):
    if not condition:
        raise _Wrong(message)


def _answered(answer, what):
    _need(answer is not None and answer is not ..., f"Not answered yet: {what}.")


# Chapter 01 ------------------------------------------------------------------------------


def _linked(a, b) -> bool:
    return sum(abs(p - q) for p, q in zip(a, b)) <= 1


@_checker
def ch01_chip_rows(chip_rows):
    """Exercise 1.1: a 4x2 grid of the v3-8 cores, one chip per row, rows following the ring."""
    from book.devices import tpu_v3_8

    cores = tpu_v3_8()
    grid = chip_rows(list(cores))
    _answered(grid, "chip_rows returns nothing yet; return a 4x2 array of the cores")
    grid = np.asarray(grid, dtype=object)
    _need(grid.shape == (4, 2), f"The grid has shape {grid.shape}; it should be (4, 2).")
    ids = sorted(getattr(c, "id", -1) for c in grid.ravel())
    _need(ids == list(range(8)), "The grid should hold each of the eight cores exactly once.")
    for r, row in enumerate(grid):
        _need(
            row[0].coords == row[1].coords,
            f"Row {r} holds cores {row[0].id} and {row[1].id}, which sit on different chips.",
        )
    for r in range(4):
        a, b = grid[r, 0].coords, grid[(r + 1) % 4, 0].coords
        _need(
            _linked(a, b),
            f"Rows {r} and {(r + 1) % 4} hold chips {a[:2]} and {b[:2]}, which share no "
            "direct link, so the ring along 'data' takes a detour.",
        )
    return "each row is one chip, and consecutive rows (wrapping around) are linked chips."


@_checker
def ch01_reversed_mesh(reversed_mesh):
    """Exercise 1.2: a 2x2x2 Mesh over the devices in reverse id order, with explicit types."""
    import jax
    from jax.sharding import AxisType, Mesh

    devices = jax.devices()[:8]
    mesh = reversed_mesh(devices)
    _answered(mesh, "reversed_mesh returns nothing yet; return a jax.sharding.Mesh")
    _need(isinstance(mesh, Mesh), f"reversed_mesh returned a {type(mesh).__name__}, not a Mesh.")
    _need(
        tuple(mesh.axis_names) == ("pipe", "data", "model"),
        f"The axes are named {tuple(mesh.axis_names)}; use ('pipe', 'data', 'model').",
    )
    _need(mesh.devices.shape == (2, 2, 2), f"The mesh has shape {mesh.devices.shape}, not 2x2x2.")
    order = [d.id for d in mesh.devices.ravel()]
    want = [d.id for d in reversed(devices)]
    _need(order == want, f"Read in order, the mesh holds devices {order}; it should be {want}.")
    _need(
        all(t == AxisType.Explicit for t in mesh.axis_types),
        f"The axis types are {mesh.axis_types}; pass axis_types=(AxisType.Explicit,) * 3.",
    )
    return "a 2x2x2 mesh over the devices in reverse order, with explicit axis types."


# Chapter 02 ------------------------------------------------------------------------------


def _mesh_2x4():
    import jax
    from jax.sharding import AxisType

    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


@_checker
def ch02_predict(shard_shape, replication):
    """Exercise 2.1: shard shape and replication of (16, 8, 4) under P(None, ('model', 'data'))."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    _answered(shard_shape, "set shard_shape to a tuple such as (16, 8, 4)")
    _answered(replication, "set replication to a whole number")
    x = jax.device_put(
        np.zeros((16, 8, 4), np.float32), NamedSharding(_mesh_2x4(), P(None, ("model", "data")))
    )
    real_shape = x.sharding.shard_shape(x.shape)
    copies = len(x.sharding.device_set) // len({str(s.index) for s in x.addressable_shards})
    _need(
        tuple(shard_shape) == real_shape,
        f"The shard shape is not {tuple(shard_shape)}: dimension 1 is split over both mesh "
        "axes together, 4 x 2 = 8 ways.",
    )
    _need(
        replication == copies,
        f"Not {replication} copies: the spec uses every mesh axis, so each block lives on "
        f"{copies} device.",
    )
    return f"each device holds a {real_shape} block and nothing is replicated."


@_checker
def ch02_rows_on_device_1(rows):
    """Exercise 2.2: which rows of the 8x8 matrix device 1 holds under P(('model', 'data'))."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    _answered(rows, "set rows to the list of row numbers device 1 holds")
    x = jax.device_put(
        np.arange(64).reshape(8, 8), NamedSharding(_mesh_2x4(), P(("model", "data"), None))
    )
    device = jax.devices()[1]
    shard = next(s for s in x.addressable_shards if s.device == device)
    real = list(range(*shard.index[0].indices(8)[:2]))
    _need(
        sorted(rows) == real,
        f"Device 1 does not hold rows {sorted(rows)}: with 'model' as the major axis, rows are "
        "dealt out along 'model' first, then along 'data'.",
    )
    return f"device 1 (data=0, model=1) holds row {real[0]}."


@_checker
def ch02_spec_for_64_bytes(spec):
    """Exercise 2.3: a spec that stores exactly 64 bytes of an 8x8 int32 matrix per device."""
    import jax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    _answered(spec, "set spec to a PartitionSpec, such as P('pipe', None)")
    _need(isinstance(spec, PartitionSpec), f"spec is a {type(spec).__name__}, not a P(...).")
    mesh = jax.make_mesh((2, 2, 2), ("pipe", "data", "model"), axis_types=(AxisType.Explicit,) * 3)
    try:
        x = jax.device_put(np.arange(64, dtype=np.int32).reshape(8, 8), NamedSharding(mesh, spec))
    except Exception as err:  # JAX's own words for an impossible spec
        raise _Wrong(f"JAX cannot use {spec}: {str(err).splitlines()[0][:160]}") from None
    per_device = max(s.data.nbytes for s in x.addressable_shards)
    ways = 256 // per_device
    _need(
        per_device == 64,
        f"{spec} stores {per_device} bytes per device: it splits the matrix {ways} ways, and "
        "64 bytes needs 4.",
    )
    return f"{spec} splits the matrix 4 ways and keeps 2 copies of every block."
