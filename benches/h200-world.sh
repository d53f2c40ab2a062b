#!/usr/bin/env bash
# `gpubake probe --world` on one machine with two GPUs: two ranks as torchrun would start them
# (RANK, WORLD_SIZE, MASTER_ADDR), one GPU each (--devices), meeting over the rendezvous and
# then in NCCL, three times:
#   one-node   both ranks on one node: NCCL should connect them GPU to GPU (P2P over NVLink);
#   two-nodes  NCCL_HOSTID differs per rank, so NCCL takes them for two hosts and must use
#              its network transport (NET/Socket: these machines have no InfiniBand);
#   preset     as two-nodes under a socket preset (NCCL_SOCKET_NTHREADS=4,
#              NCCL_NSOCKS_PERTHREAD=4): the ranks meet twice, the second time with those
#              variables set empty, and the verdict compares the two (the preset A/B);
#   dead-rank  as two-nodes, but rank 1 is killed once it has NCCL's unique id: rank 0's
#              non-blocking init must give up at its deadline and the verdict say so.
# Rank 0's verdicts (JSON) and a summary go to OUTDIR; everything else (the other rank's
# reports, standard error, NCCL's own logs) into OUTDIR/raw.tgz.
# usage: benches/h200-world.sh BINARY OUTDIR
# BINARY must read the test variable that kills rank 1 (dead-rank): a release build reads it
# only with `cargo build --release --features world-test-hooks`.
set -uo pipefail
bin=$1
out=$2
mkdir -p "$out"
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
. "$(dirname "$0")/lib.sh"
export MASTER_ADDR=127.0.0.1 WORLD_SIZE=2 TORCHELASTIC_RUN_ID=h200-world
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv,noheader
nvidia-smi topo -m | head -4

# world NAME PORT TIMEOUT HOSTID0 HOSTID1 [VAR=VALUE for rank 1...]; $BOTH: VAR=VALUE
# words for both ranks.
world() {
  local name=$1 port=$2 timeout=$3 host0=$4 host1=$5
  shift 5
  local start=$SECONDS
  local args=(probe --world --quick --json --world-port "$port" --world-timeout "$timeout"
    --world-nccl-log "$raw/nccl-$name")
  (
    if [ -n "$host1" ]; then export NCCL_HOSTID=$host1; fi
    for kv in ${BOTH:-} "$@"; do export "${kv?}"; done
    RANK=1 LOCAL_RANK=1 exec "$bin" "${args[@]}" --devices 1
  ) >"$raw/$name-rank1.json" 2>"$raw/$name-rank1.err" &
  (
    if [ -n "$host0" ]; then export NCCL_HOSTID=$host0; fi
    for kv in ${BOTH:-}; do export "${kv?}"; done
    RANK=0 LOCAL_RANK=0 exec "$bin" "${args[@]}" --devices 0
  ) >"$out/world-$name-rank0.json" 2>"$raw/$name-rank0.err"
  local status=$?
  wait
  echo "== $name: rank 0 exit $status in $((SECONDS - start)) s"
  world_checks "$out/world-$name-rank0.json"
}

world one-node 29411 60 "" ""
world two-nodes 29421 60 node-a node-b
BOTH="NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4" world preset 29441 60 node-a node-b
world dead-rank 29431 20 node-a node-b GPUBAKE_WORLD_TEST_DIE_BEFORE_REPORT=1
tar -C "$raw" -czf "$out/raw.tgz" .
ls -la "$out"
