"""What each device holds: shard shapes, bytes and replication, blocks, and where values went.

Everything here is read from ``addressable_shards`` and returned as plain data, so a chapter can
assert on it and ``book.display`` can draw it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from book import validate
from book.errors import ReaderError

MAX_BLOCKS = 256  # devices one picture shows
MAX_VALUES = 4096  # values in one device's block


class ShardError(ReaderError, ValueError):
    """Blocks that cannot be read or traced, explained in one sentence."""


@dataclass(frozen=True)
class Summary:
    """Where an array's bytes live."""

    shape: tuple[int, ...]
    dtype: str
    shard_shape: tuple[int, ...]
    total_bytes: int
    bytes_per_device: int
    devices: int
    distinct_shards: int

    @property
    def replication(self) -> int:
        """How many devices hold each distinct shard."""
        return self.devices // self.distinct_shards


@validate.impostors_refused
def index_key(index, shape) -> tuple[tuple[int, int], ...]:
    """A shard's index as (start, stop) per dimension: equal keys mean the same slice."""
    index = validate.slices(index, "index")
    shape = validate.sizes(shape, "shape", low=0, max_rank=64)  # NumPy's most dimensions
    # A key array's shards carry one whole slice more, over the key's own data: only whole
    # slices may go past the shape's dimensions.
    for extra in index[len(shape) :]:
        if extra != slice(None):
            raise ShardError(
                f"index has {len(index)} slices for a shape of {len(shape)} dimensions, and "
                f"{extra} past them is not the whole of a dimension; give one slice per "
                "dimension of the shape."
            )
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


@validate.impostors_refused
def summarize(x) -> Summary:
    """Shard shape, bytes per device and replication of a ``jax.Array``."""
    validate.array(x, "summarize's argument", keys=True)
    shards = x.addressable_shards
    keys = {index_key(s.index, x.shape) for s in shards}
    per_device = {}
    for s in shards:
        per_device[s.device] = per_device.get(s.device, 0) + s.data.nbytes
    return Summary(
        shape=tuple(x.shape),
        dtype=str(x.dtype),
        shard_shape=tuple(x.sharding.shard_shape(x.shape)),
        total_bytes=int(x.nbytes),
        bytes_per_device=max(per_device.values()),
        devices=len(x.sharding.device_set),
        distinct_shards=len(keys),
    )


@validate.impostors_refused
def device_blocks(x) -> list[tuple[str, np.ndarray]]:
    """Each device's block of ``x`` in mesh order, labelled with its device id and mesh position.

    For the output of ``jax.shard_map`` this is exactly what each device's function returned,
    whether ``out_specs`` concatenates the blocks or promises they are equal.
    """
    return _device_blocks(x, "device_blocks's argument")


def _device_blocks(x, what: str) -> list[tuple[str, np.ndarray]]:
    validate.array(x, what)
    by_device = {s.device: np.asarray(s.data) for s in x.addressable_shards}
    mesh = getattr(x.sharding, "mesh", None)
    if mesh is None or not hasattr(mesh, "devices"):
        return [(f"device {d.id}", by_device[d]) for d in sorted(by_device, key=lambda d: d.id)]
    blocks = []
    for pos, device in np.ndenumerate(np.asarray(mesh.devices)):
        coord = ", ".join(f"{n}={i}" for n, i in zip(mesh.axis_names, pos))
        blocks.append((f"device {device.id} ({coord})", by_device[device]))
    return blocks


def _device_order(x) -> list[int] | None:
    """The device ids of a jax.Array's blocks in the order ``blocks`` lists them; None for a
    list of blocks, whose positions are the reader's own."""
    import jax

    if not isinstance(x, jax.Array) or x.is_deleted():
        return None
    mesh = getattr(x.sharding, "mesh", None)
    if mesh is None or not hasattr(mesh, "devices"):
        return sorted(s.device.id for s in x.addressable_shards)
    return [d.id for d in np.asarray(mesh.devices).flat]


@validate.impostors_refused
def blocks(given, what: str = "blocks's argument") -> list[tuple[str, np.ndarray]]:
    """Labelled per-device blocks from a ``jax.Array``, (label, values) pairs, or bare values.

    ``what`` names the argument in a refusal, as the function the reader called calls it.
    """
    import jax

    if isinstance(given, jax.Array):
        return _device_blocks(given, what)
    given = validate.plain(given)
    if not isinstance(given, (list, tuple)) or not given:
        raise ShardError(
            "Pass a jax.Array, or a list with one block per device (values, or (label, values) "
            f"pairs), not {validate.describe(given)}."
        )
    if len(given) > MAX_BLOCKS:
        raise ShardError(f"There are {len(given)} blocks; a picture shows at most {MAX_BLOCKS}.")
    pairs = []
    for k, item in enumerate(given):
        label, values = f"device {k}", item
        item = validate.plain(item)
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            label, values = validate.plain(item[0])[:60], item[1]
        try:
            values = validate.widened(np.asarray(values))
        except Exception:
            values = None
        if values is None or values.dtype.kind not in "biufc" or values.size > MAX_VALUES:
            raise ShardError(
                f"The block of {label} must be numbers (at most {MAX_VALUES} of them), not "
                f"{validate.describe(item)}."
            )
        pairs.append((label, values))
    return pairs


@validate.impostors_refused
def trace_moves(before, after) -> tuple[dict[tuple[int, int], list], set[int]]:
    """Where every output value came from, found by looking it up among the inputs.

    Returns ``{(source, destination): [values]}`` and the destinations holding zeros that no
    input had (what ``ppermute`` writes where nobody sends). Inputs must hold distinct values.
    Input values that no output holds are in no move: a slice of the input traces as a slice.
    """
    orders = [_device_order(x) for x in (before, after)]
    if None not in orders and orders[0] != orders[1]:  # position k would name two devices
        raise ShardError(
            f"before lies on devices {orders[0]} and after on {orders[1]}, in another order or "
            "on other devices, so a block's position names a different device in each; trace "
            "arrays laid out on one mesh."
        )
    before, after = blocks(before, "trace_moves's before"), blocks(after, "trace_moves's after")
    home = {}
    for k, (_, b) in enumerate(before):
        for v in b.ravel().tolist():
            if v != v:
                raise ShardError(
                    "An input holds nan, whose path cannot be traced (nan equals nothing, not "
                    "even itself); give every input element a distinct number."
                )
            if v in home:
                raise ShardError(
                    f"The value {v} appears twice among the inputs, so its path cannot be traced; "
                    "give every input element a distinct value."
                )
            home[v] = k
    moves, zeros = {}, set()
    for d, (label, a) in enumerate(after):
        for v in a.ravel().tolist():
            if v in home:
                moves.setdefault((home[v], d), []).append(v)
            elif v == 0:
                zeros.add(d)
            else:
                raise ShardError(
                    f"{label} holds {v}, which no device held before; for a reduction pass "
                    "reduce='sum' or reduce='mean'."
                )
    return moves, zeros
