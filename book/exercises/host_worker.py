"""One process of a chapter 11 exercise check, run by ``book.multihost.launch`` as a script.

The checker writes the reader's function into a small module beside the names the chapter's
workers have (``READER_HEAD``), and starts this file in each process with the exercise's name,
that module's path, the function's name and the exercise's arguments. Each process prints one
``RESULT <json>`` line for the checker to read. The file only runs as a script: importing it
starts nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import book.data
from book import validate

READER_HEAD = """\
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import book
import book.data
from book import validate
"""


def column_means(reader, seed):
    """Exercise 11.1: fresh rows in each process; the reader's means as each process sees them."""
    me = jax.process_index()
    local = np.random.default_rng([int(seed), me]).integers(-4, 5, size=(8, 3)).astype(np.float32)
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
    out = reader(local, mesh)
    result = {"local": local.tolist(), "none": out is None}
    try:
        result["out"] = None if out is None else np.asarray(out, dtype=np.float64).tolist()
    except RuntimeError:  # a global array that spans the other process's devices
        result["unreadable"] = str(getattr(getattr(out, "sharding", None), "spec", "?"))
    except (TypeError, ValueError):  # no numbers: a generator, a text, a ragged list
        result["no_numbers"] = validate.describe(out)
    return result


def own_rows(reader, folder, seed):
    """Exercise 11.2: the batch the reader builds, and every row its process asked for."""
    source = book.data.Source(folder)
    asked = []
    read = source.read

    def logged(field, rows):
        asked.extend(np.asarray(rows).ravel().tolist())
        return read(field, rows)

    source.read = logged
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    sharding = NamedSharding(mesh, P(("model", "data")))
    rows = book.data.epoch_order(source.num_examples, int(seed), 1)[:64]
    batch = book.data.Batch(source, "x", rows)
    out = reader(batch, sharding)
    want = np.asarray(source.fields["x"])[rows]
    held = sharding.addressable_devices_indices_map(batch.shape).values()
    result = {
        "asked": asked,
        "mine": sorted(int(r) for index in held for r in rows[index[0]]),
        "type": type(out).__name__,
    }
    if isinstance(out, jax.Array) and out.shape == batch.shape:
        result["same_sharding"] = out.sharding.is_equivalent_to(sharding, out.ndim)
        result["spec"] = str(out.sharding.spec)
        result["shards_ok"] = all(
            np.array_equal(np.asarray(s.data), want[s.index]) for s in out.addressable_shards
        )
        gathered = multihost_utils.process_allgather(out, tiled=True)
        result["values_ok"] = bool(np.array_equal(gathered, want))
    return result


EXERCISES = {"column_means": column_means, "own_rows": own_rows}


def main(exercise, reader_path, reader_name, *args):
    """Join the launch's processes, run one exercise on the reader's function, print its result."""
    jax.distributed.initialize(
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
    )
    spec = importlib.util.spec_from_file_location("reader_answer", reader_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = EXERCISES[exercise](getattr(module, reader_name), *args)
    print("RESULT " + json.dumps(result), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
