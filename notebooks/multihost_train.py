"""One process of a data-parallel training run fed by chapter 10's loader.

Every process runs this file. Each builds every global batch with
jax.make_array_from_process_local_data, reading only the rows its own devices hold, and
all of them train one model together. Usage:

    python multihost_train.py DATA_FOLDER EPOCHS GLOBAL_BATCH
"""

import os
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import book.data
import book.models

if "JAX_NUM_PROCESSES" in os.environ:  # started by book.multihost.launch
    jax.distributed.initialize(
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
    )
else:  # Slurm, Cloud TPU, ...: initialize finds its peers by itself
    jax.distributed.initialize()

folder, epochs, global_batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hidden, classes, learning_rate = 32, 4, 0.1  # as in chapter 10

mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
sharding = NamedSharding(mesh, P("data"))
replicated = NamedSharding(mesh, P())


def from_process_local_data(batch, sharding):
    rows = book.data.process_slice(sharding, batch.shape)
    local = batch.read((rows,))
    return jax.make_array_from_process_local_data(sharding, local, batch.shape)


source = book.data.Source(folder)
loader = book.data.Loader(source, global_batch, sharding, from_process_local_data)
features = source.fields["x"].shape[1]
mine = book.data.process_slice(sharding, (global_batch,))
print(f"rows of each batch read here: {mine.start}:{mine.stop}")

# Every process computes the same initial parameters, placed on every device.
params = jax.device_put(book.models.init(1, features, hidden, classes), replicated)


@jax.jit
def train_step(params, x, labels):
    loss, grads = jax.value_and_grad(book.models.loss)(params, x, labels)
    return book.models.sgd(params, grads, learning_rate), loss


for epoch in range(epochs):
    ids = []
    for step, batch in enumerate(loader.epoch(epoch)):
        params, loss = train_step(params, batch["x"], batch["y"])
        ids.append(book.data.local_values(batch["id"]))
        print(f"epoch {epoch} step {step} loss: {float(loss):.6f}")
    # The example numbers every process saw this epoch, gathered everywhere.
    seen = multihost_utils.process_allgather(np.concatenate(ids))
    book.data.check_epoch(seen, source.num_examples)
    print(f"epoch {epoch}: {seen.size} examples over all processes, each once")

read_here = sum(source.reads) // len(source.fields)
print(f"rows read here: {read_here} of {epochs * source.num_examples}")
print(f"largest read: {max(source.reads)} rows")
print(f"final w1 sum: {float(params['w1'].sum()):.6f}")

jax.distributed.shutdown()
