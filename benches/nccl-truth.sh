#!/usr/bin/env bash
# What NCCL itself does with each case of benches/nccl-truth-cases.txt: one NCCL run per case
# (the probe's worker: ncclCommInitAll over the GPUs, an all-reduce at 1 MiB and 64 MiB) with
# INFO logging of INIT, ENV, GRAPH and TUNING to a private file, and the run's result. Writes
# one JSON line per case to OUTDIR/nccl-truth-raw.jsonl: the case, the exit status, the
# worker's result, NCCL's log. Changes nothing on the host. Each run points NCCL_CONF_FILE at
# an empty private file; NCCL still reads /etc/nccl.conf for variables a run leaves unset, so
# the script stops when that file sets anything, rather than measure a mix of settings.
# usage: benches/nccl-truth.sh BINARY OUTDIR [CASES]
set -uo pipefail
. "$(dirname "$0")/lib.sh"
bin=$1
out=$2
cases=${3:-$(dirname "$0")/nccl-truth-cases.txt}
mkdir -p "$out"
if [ -r /etc/nccl.conf ] && grep -Eq '^[[:space:]]*(export[[:space:]]+)?[A-Z_]+=' /etc/nccl.conf; then
  echo "/etc/nccl.conf sets NCCL variables that every case would inherit; run where it sets none" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: >"$work/empty-nccl.conf"

lib_shim "$work/shim"

raw=$out/nccl-truth-raw.jsonl
: >"$raw"
n=0
while IFS= read -r line; do
  case "$line" in '#'*|'') continue ;; esac
  n=$((n + 1))
  dir=$work/case$n
  mkdir -p "$dir"
  env_args=(NCCL_CONF_FILE="$work/empty-nccl.conf" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH,TUNING
            NCCL_DEBUG_FILE="$dir/nccl.%p.log" LD_LIBRARY_PATH="$SHIM_PATH")
  if [ "$line" != "-" ]; then
    name=${line%%=*}
    value=${line#*=}
    # Never NVLink multicast: a case may only confirm it off.
    if [ "$name" = NCCL_NVLS_ENABLE ] && [ "$value" != 0 ]; then
      echo "refusing case $line: NCCL_NVLS_ENABLE stays 0" >&2
      continue
    fi
    env_args+=("$name=$value")
  fi
  start=$(date +%s.%N)
  env "${env_args[@]}" NCCL_NVLS_ENABLE=0 timeout 60 "$bin" probe-worker --result "$dir/result.json" \
    nccl --sizes 1048576,67108864 --iters 5 >"$dir/stdout" 2>"$dir/stderr"
  status=$?
  end=$(date +%s.%N)
  python3 - "$line" "$status" "$dir" "$start" "$end" >>"$raw" <<'PY'
import glob, json, sys
case, status, d, start, end = sys.argv[1:]
def read(p):
    try:
        return open(p, errors="replace").read()
    except OSError:
        return None
result = read(d + "/result.json")
print(json.dumps({
    "case": case,
    "exit": int(status),
    "seconds": round(float(end) - float(start), 2),
    "result": json.loads(result) if result else None,
    "log": "".join(read(f) or "" for f in sorted(glob.glob(d + "/nccl.*.log"))),
    "stdout": (read(d + "/stdout") or "")[-4000:],
    "stderr": (read(d + "/stderr") or "")[-4000:],
}))
PY
  echo "case $n: $line -> exit $status ($(python3 -c "print(round($end-$start,1))") s)"
done <"$cases"
echo "$n cases in $raw"
