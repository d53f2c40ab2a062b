#!/usr/bin/env bash
# `gpubake probe --world` on one machine with two GPUs: two ranks as torchrun would start
# them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each probing its own GPU (--devices),
# meeting over the rendezvous on MASTER_PORT+1. Rank 0's verdict goes to OUTDIR.
# usage: benches/h200-world.sh BINARY OUTDIR
set -uo pipefail
bin=$1
out=$2
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29400 WORLD_SIZE=2
start=$SECONDS
RANK=1 LOCAL_RANK=1 "$bin" probe --world --quick --devices 1 --world-timeout 120 >"$out/world-rank1.txt" 2>&1 &
RANK=0 LOCAL_RANK=0 "$bin" probe --world --quick --devices 0 --world-timeout 120 --json >"$out/world-rank0.json" 2>"$out/world-rank0.err"
status=$?
wait
echo "rank 0 exit $status in $((SECONDS - start)) s"
