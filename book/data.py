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

import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from book import validate
from book.errors import ReaderError
from book.lessons.data_loading import rows_of_this_process

# An epoch's order is one permutation held in memory: 2**27 example numbers take 1 GiB.
MAX_EXAMPLES = 2**27
MAX_SEED = 2**63 - 1
_KINDS = "biufc"  # booleans, integers, floats and complex numbers: what a jax.Array can hold


def _folder(folder, what: str) -> Path:
    try:
        path = os.fspath(folder) if isinstance(folder, os.PathLike) else folder
    except Exception:  # noqa: BLE001 - a path object of the reader's whose __fspath__ fails
        path = None
    path = validate.plain(path)
    if not isinstance(path, str) or not path.strip():
        raise ReaderError(f"{what} must be a folder path, not {validate.describe(folder)}.")
    if "\0" in path:
        raise ReaderError(f"{what} holds a NUL character, which no path can; check the path.")
    validate.local(path, what)
    try:
        return Path(path).expanduser()  # ~/data: the home folder's, as a shell reads it
    except (RuntimeError, UnicodeError):  # ~nobody: no such user (or no name a user has)
        raise ReaderError(
            f"{what} names a home folder that does not exist: {_shown(path)}."
        ) from None


def _shown(path) -> str:
    """A path as a message quotes it: on one line, a long one cut short."""
    return validate.describe(str(path), 120)


def _open_field(path: Path, where: str) -> np.ndarray:
    """A field's file, memory-mapped: only a regular file, so a pipe cannot block the reader.

    Opening a named pipe (a FIFO) for reading waits for a writer that may never come, and a
    device such as ``/dev/zero`` never ends, so anything but a regular file is refused first.
    """
    try:
        regular = path.is_file()
    except OSError:
        regular = False
    if not regular:
        raise ReaderError(
            f"{_shown(path.name)}{where} is not a regular file (a folder, a pipe or a device); "
            "keep only the fields book.data.write saves there."
        )
    try:
        return np.load(path, mmap_mode="r")
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same mistake
        raise ReaderError(
            f"{_shown(path.name)}{where} is not a readable .npy file of numbers "
            f"({type(err).__name__}); write it again with book.data.write."
        ) from None


def _field_paths(folder: Path) -> list[Path]:
    try:
        return sorted(folder.glob("*.npy")) if folder.is_dir() else []
    except OSError as err:
        raise ReaderError(
            f"{_shown(folder)} cannot be read ({err.strerror}); check the path."
        ) from None


def _check_field(name: str, values: np.ndarray, where: str) -> None:
    """A field the loader can serve: numbers, one row per example, at least one example."""
    kind = values.dtype.name
    if values.dtype.type.__module__ == "ml_dtypes":  # bfloat16, float8, int4: no .npy type
        wider = "int32" if "int" in kind else "float32"
        raise ReaderError(
            f"Field {name!r}{where} is {kind}, which a .npy file cannot store (it reads back "
            f"as raw bytes); write it as {wider} and cast each built batch to {kind}."
        )
    if values.dtype.kind not in _KINDS:
        raise ReaderError(
            f"Field {name!r}{where} holds {values.dtype} values, which a jax.Array cannot hold; "
            "store numbers (integers, floats or booleans)."
        )
    if not values.dtype.isnative:
        raise ReaderError(
            f"Field {name!r}{where} is stored in the other byte order ({values.dtype.str}), "
            "which JAX does not take; write it again with book.data.write."
        )
    if values.ndim == 0:
        raise ReaderError(
            f"Field {name!r}{where} is a single value (a 0-d array); store one row per "
            "example, as an array of at least one dimension."
        )
    if len(values) == 0:
        raise ReaderError(f"Field {name!r}{where} has no examples; store at least one row.")
    if len(values) > MAX_EXAMPLES:
        raise ReaderError(
            f"Field {name!r}{where} has {len(values):,} examples, more than one epoch's order "
            f"can hold in memory here; use at most {MAX_EXAMPLES:,}."
        )


class Source:
    """Examples stored as one ``.npy`` file per field, memory-mapped and read by row number.

    Memory-mapping means opening the source reads nothing: only the rows asked for are read,
    as from a shared file system on a cluster. Every read is logged in ``reads`` (how many rows
    each read fetched), so a chapter can check that no read ever fetched a whole batch.
    """

    def __init__(self, folder):
        self.folder = _folder(folder, "The source")
        paths = _field_paths(self.folder)
        if not paths:
            raise ReaderError(
                f"There are no .npy files in {_shown(self.folder)}; write the data first."
            )
        self.fields = {}
        for path in paths:
            self.fields[path.stem] = _open_field(path, f" in {_shown(self.folder)}")
            _check_field(path.stem, self.fields[path.stem], f" in {_shown(self.folder)}")
            _check_range(path.stem, self.fields[path.stem])
        sizes = {len(a) for a in self.fields.values()}
        if len(sizes) != 1:
            raise ReaderError(
                f"The fields in {_shown(self.folder)} have different numbers of rows "
                f"({sorted(sizes)}); write them all with the same number of examples."
            )
        self.num_examples = sizes.pop()
        self.reads: list[int] = []
        # Opened with jax_enable_x64 on, no field's range was checked: each is, once, at its
        # first read with it off.
        self._narrow_checked = set() if _x64() else set(self.fields)

    def require(self, **ranks: int) -> None:
        """Refuse, in one sentence, a source without these fields of these ranks (counting
        the rows' dimension): what a script reads, checked before it reads it."""
        for name, rank in ranks.items():
            if not name or not validate._is_whole(rank) or not 0 <= rank <= 32:
                raise ReaderError(
                    f"require takes fields and their numbers of dimensions, such as x=2, not "
                    f"{name or 'an empty name'}={validate.describe(rank)}."
                )
            if name not in self.fields:
                wanted = ", ".join(ranks)
                raise ReaderError(
                    f"{_shown(self.folder)} holds no field {name!r}; write {wanted} with "
                    "book.data.write, as chapter 10 does."
                )
            if self.fields[name].ndim != rank:
                raise ReaderError(
                    f"Field {name!r} of {_shown(self.folder)} has {self.fields[name].ndim} "
                    f"dimension(s), where {rank} are read; write it again."
                )

    def read(self, field: str, rows) -> np.ndarray:
        """The rows numbered ``rows`` of ``field``, in that order, as an in-memory array.

        Row numbers run from 0 to ``num_examples - 1``; a negative one is refused rather than
        counted from the end, as NumPy would, since no example is numbered -1.
        """
        field = validate.plain(field)
        if not isinstance(field, str) or field not in self.fields:
            raise ReaderError(
                f"{validate.describe(field)} is not a field of the source; use one of "
                f"{', '.join(map(repr, self.fields))}."
            )
        rows = _rows(rows, self.num_examples)
        if field not in self._narrow_checked and not _x64():
            _check_range(field, self.fields[field])
            self._narrow_checked.add(field)
        self.reads.append(int(rows.size))
        return np.asarray(self.fields[field][rows])

    def __repr__(self):
        shapes = ", ".join(f"{k} {v.shape[1:]} {v.dtype}" for k, v in self.fields.items())
        return f"Source({self.num_examples} examples: {shapes})"


def _x64() -> bool:
    import jax

    return bool(jax.config.jax_enable_x64)


@validate.impostors_refused
def _check_range(name: str, values: np.ndarray) -> None:
    """Values a jax.Array holds as they are: JAX keeps 64-bit numbers as 32-bit ones unless
    jax_enable_x64 is on, and no float wider than 64 bits."""
    kind, size = values.dtype.kind, values.dtype.itemsize
    if (kind == "f" and size > 8) or (kind == "c" and size > 16):
        raise ReaderError(
            f"Field {name!r} holds {values.dtype} values, wider than any float JAX has; write "
            "it as float64 or float32."
        )
    if _x64() or size < 8 or not values.size or kind not in "iufc":
        return
    if kind == "c":  # each part as a float
        values = np.concatenate([values.real.ravel(), values.imag.ravel()])
        kind = "f"
    narrow = {"i": np.int32, "u": np.uint32, "f": np.float32}[kind]
    with np.errstate(invalid="ignore"):
        finite = values[np.isfinite(values)] if kind == "f" else values
        low, high = (finite.min(), finite.max()) if finite.size else (0, 0)
        # A nonzero float below float32's smallest becomes 0.
        vanish = kind == "f" and bool(np.any((finite != 0) & (abs(finite) < 7e-46)))
    limits = np.finfo(narrow) if kind == "f" else np.iinfo(narrow)
    if low < limits.min or high > limits.max or vanish:
        raise ReaderError(
            f"Field {name!r} holds values from {low} to {high}, beyond {np.dtype(narrow)}, which "
            "JAX makes of them (jax_enable_x64 is off); scale them, or turn jax_enable_x64 on."
        )


def write(folder, **fields) -> Source:
    """Save each field as ``folder/<name>.npy`` and open them as a ``Source``.

    Everything is checked before anything is written: every field, and the fields the folder
    already holds that these do not replace, which must have as many rows, since the source
    reads them all. Each file is written under another name first and renamed into place at
    the end, so a refused or failed write leaves the folder as it was.
    """
    folder = _folder(folder, "The folder")
    if not fields:
        raise ReaderError("Give write at least one field, such as x=values.")
    arrays = {}
    for name, values in fields.items():
        validate.name(name, "Each field's name")
        if isinstance(values, np.ma.MaskedArray):  # np.asarray would keep the masked fill
            raise ReaderError(
                f"Field {name!r} is a masked array, whose mask a .npy file drops; fill or drop "
                "the masked rows first (values.filled(...) or values.compressed())."
            )
        try:
            arrays[name] = np.asarray(values)
            if not arrays[name].dtype.isnative:  # ">i4" on this machine: JAX takes none
                arrays[name] = arrays[name].astype(arrays[name].dtype.newbyteorder("="))
        except Exception:
            raise ReaderError(
                f"Field {name!r} cannot be read as an array: pass a NumPy array of numbers, not "
                f"{validate.describe(values)}."
            ) from None
        _check_field(name, arrays[name], "")
        _check_range(name, arrays[name])
    sizes = {len(a) for a in arrays.values()}
    if len(sizes) != 1:
        raise ReaderError(
            f"The fields have different numbers of rows ({sorted(sizes)}); give every field "
            "one row per example."
        )
    (rows,) = sizes
    for path in _field_paths(folder):
        if path.stem in arrays:
            continue
        kept = _open_field(path, f" in {_shown(folder)}")
        _check_field(path.stem, kept, f" in {_shown(folder)}")
        if len(kept) != rows:
            raise ReaderError(
                f"{_shown(folder)} already holds field {path.stem!r} with {len(kept):,} rows, not "
                f"{rows:,}; write into an empty folder, or write {path.stem!r} again too."
            )
    for name in arrays:
        target = folder / f"{name}.npy"
        if target.exists() and not target.is_file():
            raise ReaderError(
                f"{_shown(target)} is not a file (a folder?), so field {name!r} cannot be "
                "written there; move it away, or write into another folder."
            )
    written = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, values in arrays.items():
            partial = folder / f"{name}.npy.partial"
            with open(partial, "wb") as f:
                np.save(f, values)
            written.append((partial, folder / f"{name}.npy"))
    except OSError as err:
        for partial, _ in written:
            partial.unlink(missing_ok=True)
        raise ReaderError(
            f"Could not write to {_shown(folder)} ({err.strerror}); check the path."
        ) from None
    try:
        for partial, path in written:
            os.replace(partial, path)
    except OSError as err:  # the target changed under us: leave no partial file behind
        for partial, _ in written:
            partial.unlink(missing_ok=True)
        raise ReaderError(
            f"Could not write to {_shown(folder)} ({err.strerror}); check the path."
        ) from None
    return Source(folder)


@validate.impostors_refused
def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """The order of all examples in ``epoch``: a permutation fixed by ``(seed, epoch)``.

    Every process computes the same order from the same two numbers, so processes agree on the
    batches without talking to each other, and a restarted run repeats its epochs exactly.
    """
    num_examples = validate.whole(
        num_examples,
        "The number of examples",
        high=MAX_EXAMPLES,
        too_large="more than one epoch's order can hold in memory here",
    )
    seed = _seed(seed)
    epoch = validate.whole(epoch, "The epoch", low=0, high=MAX_SEED, example=0)
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


def _seed(seed) -> int:
    if seed is None:
        raise ReaderError(
            "seed must be a whole number such as 0, not None: None would shuffle differently "
            "in every run and in every process."
        )
    return validate.whole(seed, "seed", low=0, high=MAX_SEED, example=0)


def _rows(rows, num_examples: int) -> np.ndarray:
    """Example numbers: a 1-D array of whole numbers, each below ``num_examples``."""
    try:
        rows = np.asarray(rows)
    except Exception:
        rows = None
    if rows is None or rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iu"):
        raise ReaderError("rows must be a 1-D array of example numbers, such as [3, 0, 7].")
    if rows.size > validate.MAX_SIZE:  # before min and max: a broadcast view may hold 10**12
        raise ReaderError(
            f"rows holds {rows.size:,} example numbers; read at most {validate.MAX_SIZE:,} at once."
        )
    if rows.size and (rows.min() < 0 or rows.max() >= num_examples):
        raise ReaderError(
            f"rows must be example numbers from 0 to {num_examples - 1}, but they run from "
            f"{rows.min()} to {rows.max()}."
        )
    return rows.astype(np.int64)


@dataclass(frozen=True)
class Batch:
    """One field of one global batch, not yet read: the example numbers it holds, in order."""

    source: Source
    field: str
    rows: np.ndarray

    def __post_init__(self):
        if not isinstance(self.source, Source):
            raise ReaderError(
                f"A Batch reads from a book.data.Source, not {validate.describe(self.source)}."
            )
        object.__setattr__(self, "field", validate.plain(self.field))
        if not isinstance(self.field, str) or self.field not in self.source.fields:
            raise ReaderError(
                f"{validate.describe(self.field)} is not a field of the source; use one of "
                f"{', '.join(map(repr, self.source.fields))}."
            )
        object.__setattr__(self, "rows", _rows(self.rows, self.source.num_examples))

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
        index = validate.slices(index, "index")
        if len(index) > len(self.shape):
            raise ReaderError(
                f"index has {len(index)} slices but the batch has {len(self.shape)} dimensions."
            )
        first = index[0] if index else slice(None)
        values = self.source.read(self.field, self.rows[first])
        return values[(slice(None), *index[1:])]


class ScatteredRows(ReaderError):
    """This process's devices hold separate blocks of a batch's rows, which no one slice names."""


@validate.impostors_refused
def process_slice(sharding, shape) -> slice:
    """The rows of a global batch that this process's devices hold, as one slice.

    Chapter 10's ``rows_of_this_process``, with checks of its arguments. With the usual meshes
    (a process's devices next to each other along the batch axis) the rows form one block. When
    they are several separate blocks, one slice cannot name them, so this refuses
    (``ScatteredRows``); ``jax.make_array_from_process_local_data`` itself takes such blocks
    concatenated in global order.
    """
    shape = validate.sizes(shape, "The batch shape")
    if not shape:
        raise ReaderError("The batch shape must have a batch dimension, such as (64, 16).")
    if not hasattr(sharding, "addressable_devices_indices_map"):
        raise ReaderError(
            f"sharding must be a jax.sharding.Sharding, not {validate.describe(sharding)}."
        )
    try:
        rows = rows_of_this_process(sharding, tuple(shape))  # chapter 10's function
    except Exception as err:  # noqa: BLE001 - JAX's refusal of this shape, said in one line
        raise ReaderError(
            f"The sharding cannot hold a batch of shape {shape}: {_first_line(err)}."
        ) from None
    if rows is None:
        raise ScatteredRows(
            "This process's devices hold rows of the batch that are not next to each "
            "other, so no one slice names them; pass their blocks concatenated in order to "
            "jax.make_array_from_process_local_data, or build the batch with "
            "jax.make_array_from_callback."
        )
    return rows


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
        if not isinstance(source, Source):
            raise ReaderError(
                f"source must be a book.data.Source, such as book.data.write returns, not "
                f"{validate.describe(source)}."
            )
        n = source.num_examples
        global_batch = validate.whole(global_batch, "global_batch", example=64)
        if global_batch > n:
            raise ReaderError(
                f"A global batch of {global_batch} is larger than the {n} examples there are; "
                "choose a batch size that divides the number of examples."
            )
        validate.callable_(build, "build")
        seed = _seed(seed)
        _check_shardings(source, global_batch, sharding)
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
        epoch = validate.whole(epoch, "The epoch", low=0, high=MAX_SEED, example=0)
        order = epoch_order(self.source.num_examples, self.seed, epoch)
        rows = order.reshape(self.steps_per_epoch, self.global_batch)
        check_epoch(rows, self.source.num_examples)
        return rows

    def epoch(self, epoch: int) -> Iterator[dict]:
        """Yield ``{field: jax.Array}`` for each step of ``epoch``."""
        for rows in self.batch_rows(epoch):
            yield self.build_batch(rows)

    def build_batch(self, rows) -> dict:
        """``{field: jax.Array}`` for the examples numbered ``rows``, built by ``build``."""
        rows = _rows(rows, self.source.num_examples)
        if len(rows) != self.global_batch:
            raise ReaderError(
                f"A batch of this loader holds {self.global_batch} rows, not {len(rows)}."
            )
        sharding = self.sharding
        out = {}
        for field in self.source.fields:
            s = sharding[field] if isinstance(sharding, Mapping) else sharding
            batch = Batch(self.source, field, np.asarray(rows))
            out[field] = _built(self.build(batch, s), batch, s)
        return out

    def __len__(self):
        return self.steps_per_epoch


def _built(value, batch: Batch, sharding):
    """What ``build`` returned, refused unless it is the batch as asked: a jax.Array of the
    batch's shape, laid out by the sharding it was given.

    A loader that yielded whatever ``build`` returned would hand a training step ``None``, or
    an array on one device, and the step would fail far from the mistake.
    """
    import jax

    wanted = (
        f"a jax.Array of shape {batch.shape} laid out by the sharding it is given, as "
        "jax.make_array_from_callback(batch.shape, sharding, batch.read) makes"
    )
    if not isinstance(value, jax.Array):
        raise ReaderError(
            f"build returned {validate.describe(value)} for field {batch.field!r}; return {wanted}."
        )
    if value.is_deleted():  # donated, or deleted by hand: no step could read it
        raise ReaderError(
            f"build returned a deleted array for field {batch.field!r}; return {wanted}."
        )
    if value.shape != batch.shape:
        raise ReaderError(
            f"build returned an array of shape {value.shape} for field {batch.field!r}; "
            f"return {wanted}."
        )
    if not value.sharding.is_equivalent_to(sharding, value.ndim):
        raise ReaderError(
            f"build returned field {batch.field!r} laid out otherwise than the sharding it was "
            f"given; return {wanted}."
        )
    return value


def _check_shardings(source: Source, global_batch: int, sharding) -> None:
    """Every field's batch must split over its sharding, or the first step would fail."""
    from jax.sharding import Sharding

    if isinstance(sharding, Mapping):
        missing = [f for f in source.fields if f not in sharding]
        if missing:
            raise ReaderError(
                f"The shardings name no sharding for field {missing[0]!r}; give one for every "
                f"field: {', '.join(map(repr, source.fields))}."
            )
    for field, values in source.fields.items():
        s = sharding[field] if isinstance(sharding, Mapping) else sharding
        if not isinstance(s, Sharding):
            raise ReaderError(
                f"The sharding for field {field!r} must be a jax.sharding.Sharding such as "
                f"NamedSharding(mesh, P('data')), not {validate.describe(s)}."
            )
        _check_split(field, (global_batch, *values.shape[1:]), s)


def _check_split(field: str, shape: tuple[int, ...], sharding) -> None:
    spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
    if spec is not None and mesh is not None:
        if len(spec) > len(shape):
            raise ReaderError(
                f"The sharding of field {field!r} has {len(spec)} entries but its batches have "
                f"{len(shape)} dimensions, {shape}; give at most {len(shape)} entries."
            )
        sizes = dict(mesh.shape)
        for dim, entry in enumerate(spec):
            names = (entry,) if isinstance(entry, str) else tuple(entry or ())
            ways = math.prod(sizes.get(n, 1) for n in names)
            if shape[dim] % ways == 0:
                continue
            if dim == 0:
                raise ReaderError(
                    f"A global batch of {shape[0]} rows does not split over the {ways} devices "
                    f"that {spec} spreads the batch across; choose a global batch divisible "
                    f"by {ways}."
                )
            raise ReaderError(
                f"Dimension {dim} of field {field!r} has size {shape[dim]}, which the {ways} "
                f"devices of its sharding cannot split evenly; shard that field differently."
            )
    try:
        sharding.shard_shape(shape)
    except Exception as err:
        raise ReaderError(
            f"The sharding of field {field!r} cannot hold a batch of shape {shape}: "
            f"{_first_line(err)}."
        ) from None


def _first_line(err: Exception) -> str:
    """The first line of JAX's message, at most 400 characters, to end a sentence of the book's."""
    try:
        text = str(err).strip()
    except Exception:  # noqa: BLE001 - a message that cannot be printed
        text = ""
    first = text.splitlines()[0] if text else type(err).__name__
    if len(first) > 400:  # cut between words
        first = first[:400].rsplit(" ", 1)[0] + " …"
    return first.rstrip(".")


@validate.impostors_refused
def check_epoch(ids, num_examples: int) -> None:
    """Raise ``AssertionError`` unless ``ids`` holds every example number exactly once.

    Only numbers from 0 to ``num_examples - 1`` are example numbers: any other id is counted
    as such, never as an example seen.
    """
    num_examples = validate.whole(num_examples, "The number of examples", high=MAX_EXAMPLES)
    if np.ma.is_masked(ids):
        raise ReaderError("ids holds masked entries, which are no example numbers; pass the ids.")
    try:
        ids = np.asarray(ids)
    except Exception:
        ids = None
    if ids is None or (ids.size and ids.dtype.kind not in "iu"):
        raise ReaderError("ids must be an array of example numbers (whole numbers).")
    if ids.size > MAX_EXAMPLES:  # before a copy: a broadcast view stands for 10**11 ids
        raise ReaderError(
            f"ids holds {ids.size:,} example numbers; an epoch holds at most {MAX_EXAMPLES:,}."
        )
    ids = ids.ravel()
    inside = ids[(ids >= 0) & (ids < num_examples)].astype(np.int64)
    counts = np.bincount(inside, minlength=num_examples)
    missing = int(np.count_nonzero(counts == 0))
    repeated = int(np.count_nonzero(counts > 1))
    outside = len(ids) - len(inside)
    if len(ids) != num_examples or missing or repeated or outside:
        strays = f", and {outside} ids are not example numbers 0 to {num_examples - 1}"
        raise AssertionError(
            f"an epoch should see each of {num_examples} examples once; it saw {len(ids)} "
            f"rows, missed {missing} examples and repeated {repeated}" + (strays if outside else "")
        )


@validate.impostors_refused
def local_values(x) -> np.ndarray:
    """This process's block of a sharded array (its rows, for a batch), without duplicates.

    Read from ``addressable_shards``, so it works on arrays that span other processes' devices
    too; replicated copies of the same rows count once.
    """
    validate.array(x, "local_values's argument")
    if x.ndim == 0:
        raise ReaderError("local_values needs an array with a batch dimension, not a 0-d array.")
    pieces = {}  # (start, stop) along each dimension: the block, once however many copies
    for shard in x.addressable_shards:
        where = tuple(s.indices(n)[:2] for s, n in zip(shard.index, x.shape))
        pieces.setdefault(where, shard.data)
    spans = [sorted({where[d] for where in pieces}) for d in range(x.ndim)]
    if len(pieces) != math.prod(len(s) for s in spans):
        raise ReaderError(
            "This process's devices hold blocks of the array that do not form one rectangle; "
            "read it with jax.experimental.multihost_utils.process_allgather instead."
        )

    def block(prefix: tuple) -> list | np.ndarray:
        if len(prefix) == x.ndim:
            return np.asarray(pieces[prefix])
        return [block((*prefix, span)) for span in spans[len(prefix)]]

    return np.block(block(()))
