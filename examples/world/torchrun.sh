#!/bin/sh
# Run this on every node, NODE_RANK 0 to NNODES-1, MASTER_ADDR the node of NODE_RANK 0.
# Rank 0's standard output is the world's verdict. One process per node: the probe covers
# all of the node's GPUs, and the node's first GPU joins NCCL across the nodes. torchrun
# keeps MASTER_PORT for its store; the probe's rendezvous takes MASTER_PORT + 1.
set -eu
exec torchrun --no-python \
  --nnodes="${NNODES:?}" --nproc-per-node=1 \
  --node-rank="${NODE_RANK:?}" \
  --master-addr="${MASTER_ADDR:?}" --master-port="${MASTER_PORT:-29500}" \
  gpubake probe --world
