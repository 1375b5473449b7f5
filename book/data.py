"""The plumbing of chapter 10's sharded data loader: which rows each global batch holds, read
piece by piece.

A global batch is one ``jax.Array`` spread over many devices, often over many hosts. Building it
on one host and then splitting it would need the whole batch in one place, which is exactly what
stops scaling. The loader here never does that: a ``Batch`` is only the list of example numbers
in a global batch, and its ``read(index)`` fetches just the rows of one piece, so each device (or
each process) reads its own share. How the pieces become a ``jax.Array`` is the lesson, so the
chapter writes those functions out (``jax.make_array_from_callback`` and friends) and hands one
to ``Loader`` as ``build``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from book.errors import ReaderError


class Source:
    """Examples stored as one ``.npy`` file per field, memory-mapped and read by row number.

    Memory-mapping means opening the source reads nothing: only the rows asked for are read,
    as from a shared file system on a cluster. Every read is logged in ``reads`` (how many rows
    each read fetched), so a chapter can check that no read ever fetched a whole batch.
    """

    def __init__(self, folder):
        self.folder = Path(folder)
        paths = sorted(self.folder.glob("*.npy"))
        if not paths:
            raise ReaderError(f"There are no .npy files in {self.folder}; write the data first.")
        self.fields = {p.stem: np.load(p, mmap_mode="r") for p in paths}
        sizes = {len(a) for a in self.fields.values()}
        if len(sizes) != 1:
            raise ReaderError(
                f"The fields in {self.folder} have different numbers of rows ({sorted(sizes)}); "
                "write them all with the same number of examples."
            )
        self.num_examples = sizes.pop()
        self.reads: list[int] = []

    def read(self, field: str, rows) -> np.ndarray:
        """The rows numbered ``rows`` of ``field``, in that order, as an in-memory array."""
        rows = np.asarray(rows)
        self.reads.append(int(rows.size))
        return np.asarray(self.fields[field][rows])

    def __repr__(self):
        shapes = ", ".join(f"{k} {v.shape[1:]} {v.dtype}" for k, v in self.fields.items())
        return f"Source({self.num_examples} examples: {shapes})"


def write(folder, **fields) -> Source:
    """Save each field as ``folder/<name>.npy`` and open them as a ``Source``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, values in fields.items():
        np.save(folder / f"{name}.npy", np.asarray(values))
    return Source(folder)


def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """The order of all examples in ``epoch``: a permutation fixed by ``(seed, epoch)``.

    Every process computes the same order from the same two numbers, so processes agree on the
    batches without talking to each other, and a restarted run repeats its epochs exactly.
    """
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


@dataclass(frozen=True)
class Batch:
    """One field of one global batch, not yet read: the example numbers it holds, in order."""

    source: Source
    field: str
    rows: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.rows), *self.source.fields[self.field].shape[1:])

    @property
    def dtype(self):
        return self.source.fields[self.field].dtype

    def read(self, index=()) -> np.ndarray:
        """The part of the batch at ``index``, a tuple of slices into the global batch.

        This is the shape of index that ``jax.make_array_from_callback`` passes; only the rows
        its first slice selects are read.
        """
        index = tuple(index)
        first = index[0] if index else slice(None)
        values = self.source.read(self.field, self.rows[first])
        return values[(slice(None), *index[1:])]


def process_slice(sharding, shape) -> slice:
    """The rows of a global batch that this process's devices hold, as one slice.

    With the usual meshes (a process's devices next to each other along the batch axis) they
    form one block. When they are several separate blocks, one slice cannot name them, so this
    refuses; ``jax.make_array_from_process_local_data`` itself takes such blocks concatenated
    in global order.
    """
    n = shape[0]
    index_map = sharding.addressable_devices_indices_map(tuple(shape))
    spans = sorted({index[0].indices(n)[:2] if index else (0, n) for index in index_map.values()})
    for (_, stop), (start, _) in zip(spans, spans[1:]):
        if stop != start:
            raise ReaderError(
                "This process's devices hold rows of the batch that are not next to each "
                "other, so no one slice names them; pass their blocks concatenated in order to "
                "jax.make_array_from_process_local_data, or build the batch with "
                "jax.make_array_from_callback."
            )
    return slice(spans[0][0], spans[-1][1])


Build = Callable[[Batch, object], object]


class Loader:
    """Global batches for every step of an epoch, each built piece by piece by ``build``.

    ``build(batch, sharding)`` turns one field's ``Batch`` into a ``jax.Array``; the chapter
    writes it with one of JAX's three constructors. Each epoch visits every example exactly
    once in a shuffled order fixed by ``seed``; the loader checks that before yielding anything.
    """

    def __init__(
        self,
        source: Source,
        global_batch: int,
        sharding,
        build: Build,
        seed: int = 0,
    ):
        n = source.num_examples
        if not isinstance(global_batch, int) or global_batch < 1:
            raise ReaderError(f"global_batch must be a positive whole number, not {global_batch}.")
        if n % global_batch:
            raise ReaderError(
                f"{n} examples do not split into batches of {global_batch}, so some would be "
                "left out of every epoch; choose a batch size that divides the number of "
                "examples."
            )
        self.source = source
        self.global_batch = global_batch
        self.sharding = sharding
        self.build = build
        self.seed = seed

    @property
    def steps_per_epoch(self) -> int:
        return self.source.num_examples // self.global_batch

    def batch_rows(self, epoch: int) -> np.ndarray:
        """The example numbers of every batch of ``epoch``, one row per step."""
        order = epoch_order(self.source.num_examples, self.seed, epoch)
        rows = order.reshape(self.steps_per_epoch, self.global_batch)
        check_epoch(rows, self.source.num_examples)
        return rows

    def epoch(self, epoch: int) -> Iterator[dict]:
        """Yield ``{field: jax.Array}`` for each step of ``epoch``."""
        for rows in self.batch_rows(epoch):
            yield self.build_batch(rows)

    def build_batch(self, rows) -> dict:
        sharding = self.sharding
        out = {}
        for field in self.source.fields:
            s = sharding[field] if isinstance(sharding, Mapping) else sharding
            out[field] = self.build(Batch(self.source, field, np.asarray(rows)), s)
        return out

    def __len__(self):
        return self.steps_per_epoch


def check_epoch(ids, num_examples: int) -> None:
    """Raise ``AssertionError`` unless ``ids`` holds every example number exactly once."""
    ids = np.asarray(ids).ravel()
    counts = np.bincount(ids, minlength=num_examples)
    missing = np.flatnonzero(counts == 0)
    repeated = np.flatnonzero(counts > 1)
    if len(ids) != num_examples or len(missing) or len(repeated):
        raise AssertionError(
            f"an epoch should see each of {num_examples} examples once; it saw {len(ids)} "
            f"rows, missed {len(missing)} examples and repeated {len(repeated)}"
        )


def local_values(x) -> np.ndarray:
    """This process's rows of a batch-sharded array, in global order, without duplicates.

    Read from ``addressable_shards``, so it works on arrays that span other processes' devices
    too; replicated copies of the same rows count once.
    """
    pieces = {}
    for shard in x.addressable_shards:
        start = shard.index[0].indices(x.shape[0])[0] if shard.index else 0
        pieces.setdefault(start, np.asarray(shard.data))
    return np.concatenate([pieces[k] for k in sorted(pieces)])
