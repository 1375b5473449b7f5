#!/bin/bash
# Chapter 11's worker on every host of a multi-host Cloud TPU slice. A v5litepod-16 has
# 4 hosts with 4 chips each: 4 JAX processes, 16 devices.
# Run from the repository root:  bash notebooks/tpu_slice.sh
set -euo pipefail

TPU_NAME=${TPU_NAME:-jax-book-slice}
ZONE=${ZONE:-us-west4-a}
ACCELERATOR_TYPE=${ACCELERATOR_TYPE:-v5litepod-16}
RUNTIME_VERSION=${RUNTIME_VERSION:-v2-alpha-tpuv5-lite}

gcloud compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" \
  --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION"

# The same jax and the same script on every host.
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all \
  --command='python3 -m pip install -q "jax[tpu]==0.10.2"'
gcloud compute tpus tpu-vm scp notebooks/multihost_worker.py "$TPU_NAME": \
  --zone="$ZONE" --worker=all

# Start the script on all hosts at once. jax.distributed.initialize() asks each host's
# metadata server for the slice's hosts (the first one runs the coordinator) and for
# this host's number; nothing is passed by hand.
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all \
  --command='python3 multihost_worker.py'

gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" --quiet
