"""One process of a multi-controller JAX program; every process runs this same file.

Chapter 11 starts it as 2 local processes with book.multihost.launch; slurm_job.sbatch
starts it on a GPU cluster and tpu_slice.sh on every host of a Cloud TPU slice. It needs
only jax and numpy. Each process prints what it sees, one "name: value" line at a time.
"""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

if "JAX_NUM_PROCESSES" in os.environ:
    # Started by book.multihost.launch. initialize reads the coordinator's address from
    # JAX_COORDINATOR_ADDRESS itself; the process count and index are passed on.
    jax.distributed.initialize(
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
    )
    found = "JAX_* variables"
else:
    # Under Slurm, on a Cloud TPU slice, under Open MPI or Kubernetes, initialize finds
    # the coordinator, the process count and this process's index by itself.
    jax.distributed.initialize()
    found = "detected by jax.distributed.initialize()"

me, count = jax.process_index(), jax.process_count()
print(f"process_index: {me}")
print(f"process_count: {count}")
print(f"found its peers through: {found}")
print(f"platform: {jax.devices()[0].platform}")
print(f"local devices: {[d.id for d in jax.local_devices()]}")
print(f"global devices: {[d.id for d in jax.devices()]}")

# One mesh axis over every device of every process.
mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
sharding = NamedSharding(mesh, P("data"))

# A global array from host-local pieces: each process holds 2 rows per local device.
local = np.arange(2 * jax.local_device_count()) + 100 * me
x = multihost_utils.host_local_array_to_global_array(local, mesh, P("data"))
print(f"local piece: {local.tolist()}")
print(f"x.shape: {x.shape}")
print(f"x fully addressable: {x.is_fully_addressable}")
print(f"x shards here: {len(x.addressable_shards)} of {len(x.sharding.device_set)}")
print(f"print(x) shows: {x}")  # the shape and dtype, no values
try:
    np.asarray(x)
except RuntimeError as err:
    print(f"np.asarray(x) raises: RuntimeError: {str(err).split('. ')[0]}.")

# Computation on the global array runs on every device; a replicated result is readable.
total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x)
print(f"sum of x: {int(total)}")
back = multihost_utils.global_array_to_host_local_array(x, mesh, P("data"))
print(f"back to host-local: {np.asarray(back).tolist()}")

# The same kind of array from one single-device array per local device.
shape = (3 * jax.device_count(),)
pieces = [
    jax.device_put(np.arange(*index[0].indices(shape[0])) * 10, device)
    for device, index in sharding.addressable_devices_indices_map(shape).items()
]
y = jax.make_array_from_single_device_arrays(shape, sharding, pieces)
print(f"y from {len(pieces)} single-device arrays: shape {y.shape}")

# Every process gets all of x and y back as NumPy arrays.
print(f"allgather x: {multihost_utils.process_allgather(x, tiled=True).tolist()}")
print(f"allgather y: {multihost_utils.process_allgather(y, tiled=True).tolist()}")

# A barrier: the last process arrives late, and nobody leaves before it arrives.
if me == count - 1:
    time.sleep(0.3)
print(f"barrier arrive: {time.time():.3f}")
multihost_utils.sync_global_devices("after the arrays")
print(f"barrier leave: {time.time():.3f}")

# Each process draws its own number; afterwards all hold process 0's.
mine = np.random.default_rng(me).integers(1000, size=3)
print(f"drawn here: {mine.tolist()}")
print(f"after broadcast: {multihost_utils.broadcast_one_to_all(mine).tolist()}")

jax.distributed.shutdown()
