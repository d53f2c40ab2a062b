#!/usr/bin/env bash
# Who loads what in the training job's own process: the probe's framework script
# (src/probe/framework.py) under the machine's torch with glibc's LD_DEBUG=files, which logs
# every object the loader maps and what asked for it ("needed by" a DT_NEEDED, "dynamically
# loaded by" a dlopen). Run once as the script runs in the probe, once with NVSHMEM's
# remote transport set to UCX, to see whether either loads a transport or bootstrap plugin.
# usage: benches/h200-loads.sh OUTDIR TAG
set -uo pipefail
out=$1
tag=$2
. "$(dirname "$0")/lib.sh"
mkdir -p "$out"
python=$(ls /opt/*/.venv/bin/python3 2>/dev/null | head -1)
script=$(dirname "$0")/../src/probe/framework.py
run() {
  local name=$1; shift
  env "$@" MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 \
    LD_DEBUG=files LD_DEBUG_OUTPUT="$out/ld-$name" \
    "$python" "$script" "$out/rank-$name-$tag.json" 4096 1048576 >"$out/stdout-$name.txt" 2>&1
  echo "  $name: exit $?"
  # One log per process; keep the loader's lines that name what asked for each object.
  cat "$out"/ld-"$name".* | grep -E 'file=.*(needed by|dynamically loaded by)' \
    | sed -E 's/^ *[0-9]+: *//' | sort -u >"$out/loads-$name-$tag.txt"
  rm -f "$out"/ld-"$name".*
  echo "  $name: $(wc -l <"$out/loads-$name-$tag.txt") objects loaded"
  grep -E 'nccl|nvshmem|cufile|ucx|ucp|ucs|fabric|mpi|pmix|ibverbs|mlx5' "$out/loads-$name-$tag.txt" | sed 's/^/    /'
}
run default
run ucx NVSHMEM_REMOTE_TRANSPORT=ucx
"$python" - <<'PY'
import torch, importlib.metadata as m
print("  torch", torch.__version__, "cuda", torch.version.cuda)
for d in ("nvidia-nvshmem-cu13", "nvidia-nvshmem-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-cufile", "nvidia-cufile-cu12"):
    try: print("  ", d, m.version(d))
    except Exception: pass
PY
ls "$(nvidia_site)"/nvshmem/lib 2>/dev/null | sed 's/^/  nvshmem lib: /'
ls -la /usr/lib/x86_64-linux-gnu/libnccl* 2>/dev/null | sed 's/^/  system: /'
