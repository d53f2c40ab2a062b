#!/usr/bin/env bash
# `gpubake probe --world` started by torchrun itself (`--no-python`), not by variables set by
# hand as benches/h200-world.sh does, so what is judged is what torchrun really exports:
#   one-node   `torchrun --standalone --nproc-per-node N`, N the GPUs here: one rank per GPU
#              on one node; with two GPUs NCCL should join them GPU to GPU (P2P over NVLink);
#   two-nodes  two torchrun agents (`--nnodes 2`, c10d rendezvous on 127.0.0.1), one rank
#              each, with NCCL_HOSTID and CUDA_VISIBLE_DEVICES set apart per agent, so NCCL
#              takes them for two hosts and uses its network transport (NET/Socket). On a
#              machine of one GPU both agents share GPU 0. No `--devices` here: each rank
#              must take the GPU CUDA_VISIBLE_DEVICES shows it, though NVML lists both.
# Each rank records the launcher variables it was given (env-*.txt) and runs
# `probe --world --quick --json`; torchrun starts `sh`, which records them and execs gpubake
# in its place (same process, same environment), so every rank's output has a file of its own.
# Rank 0's verdicts (JSON) and a summary go to OUTDIR; the rest into OUTDIR/raw.tgz.
# usage: benches/h200-torchrun.sh BINARY OUTDIR [TAG]   (files named probe-torchrun-*-TAG.*)
set -uo pipefail
. "$(dirname "$0")/lib.sh"
bin=$(realpath "$1")
out=$(realpath -m "$2")
tag=${3:-h200}
mkdir -p "$out"
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
log=$out/probe-torchrun-log-$tag.txt
exec > >(tee "$log") 2>&1

gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
torchrun --help >"$raw/torchrun-help.txt" 2>&1
# The flags this script relies on, as this torchrun spells them.
for flag in --standalone --nnodes --node-rank --nproc-per-node --rdzv-backend --rdzv-endpoint \
  --rdzv-id --no-python --local-addr; do
  grep -q -- "$flag" "$raw/torchrun-help.txt" || echo "torchrun --help does not list $flag"
done
local_addr=()
grep -q -- --local-addr "$raw/torchrun-help.txt" && local_addr=(--local-addr 127.0.0.1)

vars='^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_RANK|ROLE_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_[A-Z_]*|NCCL_[A-Z_]*|CUDA_VISIBLE_DEVICES)='
# What torchrun runs: $1 the case's directory, then gpubake and its arguments; with PER_RANK
# set, each rank probes only the GPU of its local rank (`--devices`), as one rank per GPU should.
wrap='d=$1; shift; env | grep -E "$VARS" | sort >"$d/env-rank$RANK.txt"
exec "$@" ${PER_RANK:+--devices "$LOCAL_RANK"} >"$d/rank$RANK.json" 2>"$d/rank$RANK.err"'
probe=("$bin" probe --world --quick --json --world-timeout 60)

# report NAME: rank 0's verdict, the variables each rank got, and the world's port beside
# torchrun's MASTER_PORT.
report() {
  local name=$1 d=$raw/$1
  cp "$d/rank0.json" "$out/probe-torchrun-$name-rank0-$tag.json" 2>/dev/null
  for f in "$d"/env-rank*.txt; do
    echo "  $(basename "$f" .txt): $(tr '\n' ' ' <"$f")"
  done
  echo "  rank 0 said: $(grep -h 'gpubake: rank 0 of' "$d/rank0.err")"
  world_checks "$d/rank0.json"
}

echo "== one-node: torchrun --standalone --nproc-per-node $gpus"
mkdir -p "$raw/one-node"
start=$SECONDS
PER_RANK=1 VARS=$vars timeout 180 torchrun --standalone --nnodes 1 --nproc-per-node "$gpus" "${local_addr[@]}" \
  --no-python sh -c "$wrap" wrap "$raw/one-node" "${probe[@]}" >"$raw/one-node/torchrun.txt" 2>&1
echo "  torchrun exit $? in $((SECONDS - start)) s"
report one-node

echo "== two-nodes: two torchrun agents, c10d rendezvous at 127.0.0.1:29450"
mkdir -p "$raw/two-nodes"
start=$SECONDS
agents=()
for node in 0 1; do
  gpu=$((gpus > 1 ? node : 0))
  NCCL_HOSTID=node-$node CUDA_VISIBLE_DEVICES=$gpu VARS=$vars timeout 180 torchrun \
    --nnodes 2 --node-rank "$node" --nproc-per-node 1 --rdzv-backend c10d \
    --rdzv-endpoint 127.0.0.1:29450 --rdzv-id h200-torchrun "${local_addr[@]}" \
    --no-python sh -c "$wrap" wrap "$raw/two-nodes" "${probe[@]}" \
    >"$raw/two-nodes/torchrun-agent$node.txt" 2>&1 &
  agents+=($!)
done
# The agents by pid: a bare `wait` also waits for the `tee` above, which ends only with this
# script, and would never return.
for pid in "${agents[@]}"; do
  wait "$pid"
  echo "  agent pid $pid exit $?"
done
echo "  both agents done in $((SECONDS - start)) s"
report two-nodes

tar -C "$raw" -czf "$out/probe-torchrun-raw-$tag.tgz" .
ls -la "$out"
