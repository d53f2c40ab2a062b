#!/usr/bin/env bash
# What NCCL itself does with each case of benches/nccl-truth-cases.txt: one NCCL run per case
# (the probe's worker: ncclCommInitAll over the GPUs, an all-reduce at 1 MiB and 64 MiB) with
# INFO logging of INIT, ENV, GRAPH and TUNING to a private file, and the run's result. Writes
# one JSON line per case to OUTDIR/nccl-truth-raw.jsonl: the case, its class, the number of
# ranks, the exit status, the worker's result, NCCL's log. Cases run JOBS at a time (each its
# own process and communicator); cases still waiting when BUDGET seconds have passed are
# written as not run, so a slow machine gives a partial answer rather than none. Changes
# nothing on the host. Each run points NCCL_CONF_FILE at an empty private file; NCCL still
# reads /etc/nccl.conf for variables a run leaves unset, so the script stops when that file
# sets anything, rather than measure a mix of settings.
# usage: benches/nccl-truth.sh BINARY OUTDIR [CASES] [JOBS] [BUDGET]
set -uo pipefail
. "$(dirname "$0")/lib.sh"
bin=$(realpath "$1")
out=$2
cases=${3:-$(dirname "$0")/nccl-truth-cases.txt}
jobs=${4:-8}
budget=${5:-480}
mkdir -p "$out"
if [ -r /etc/nccl.conf ] && grep -Eq '^[[:space:]]*(export[[:space:]]+)?[A-Z_]+=' /etc/nccl.conf; then
  echo "/etc/nccl.conf sets NCCL variables that every case would inherit; run where it sets none" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: >"$work/empty-nccl.conf"
lib_shim "$work/shim"
ranks=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
deadline=$(( $(date +%s) + budget ))

# One case: its line number and text. Never NVLink multicast: NCCL_NVLS_ENABLE=0 comes last,
# so no case can turn it on.
run_case() {
  local n=$1 line=$2 dir=$work/case$1 name value cls
  mkdir -p "$dir"
  cls=${line#*$'\t'# }
  [ "$cls" = "$line" ] && cls=""
  line=${line%%$'\t'*}
  printf '%s' "$line" >"$dir/case"
  printf '%s' "$cls" >"$dir/class"
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "not-run" >"$dir/status"
    return
  fi
  local env_args=(NCCL_CONF_FILE="$work/empty-nccl.conf" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH,TUNING
                  NCCL_DEBUG_FILE="$dir/nccl.%p.log" LD_LIBRARY_PATH="$SHIM_PATH")
  if [ "$line" != "-" ]; then
    name=${line%%=*}
    value=${line#*=}
    env_args+=("$name=$value")
  fi
  local start end
  start=$(date +%s.%N)
  env "${env_args[@]}" NCCL_NVLS_ENABLE=0 timeout 30 "$bin" probe-worker --result "$dir/result.json" \
    nccl --sizes 1048576,67108864 --iters 2 >"$dir/stdout" 2>"$dir/stderr"
  echo $? >"$dir/status"
  end=$(date +%s.%N)
  echo "$start $end" >"$dir/times"
}
export -f run_case
export work bin deadline SHIM_PATH

n=0
: >"$work/queue"
while IFS= read -r line; do
  case "$line" in '#'*|'') continue ;; esac
  n=$((n + 1))
  printf '%s\0%s\0' "$n" "$line" >>"$work/queue"
done <"$cases"
xargs -0 -n 2 -P "$jobs" bash -c 'run_case "$0" "$1"' <"$work/queue"

python3 - "$work" "$n" "$ranks" >"$out/nccl-truth-raw.jsonl" <<'PY'
import glob, json, sys
work, n, ranks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def read(p):
    try:
        return open(p, errors="replace").read()
    except OSError:
        return None
for i in range(1, n + 1):
    d = f"{work}/case{i}"
    status = (read(d + "/status") or "not-run").strip()
    times = (read(d + "/times") or "").split()
    result = read(d + "/result.json")
    print(json.dumps({
        "case": read(d + "/case"),
        "class": read(d + "/class") or None,
        "ranks": ranks,
        "exit": int(status) if status.lstrip("-").isdigit() else None,
        "seconds": round(float(times[1]) - float(times[0]), 2) if len(times) == 2 else None,
        "result": json.loads(result) if result else None,
        "log": "".join(read(f) or "" for f in sorted(glob.glob(d + "/nccl.*.log"))),
        "stdout": (read(d + "/stdout") or "")[-2000:],
        "stderr": (read(d + "/stderr") or "")[-2000:],
    }))
PY
python3 - "$out/nccl-truth-raw.jsonl" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1])]
ran = [r for r in rows if r["exit"] is not None]
by = collections.Counter("not run" if r["exit"] is None else "exit 0" if r["exit"] == 0 else f"exit {r['exit']}" for r in rows)
secs = sorted(r["seconds"] for r in ran if r["seconds"] is not None)
print(f"{len(rows)} cases, {len(ran)} run on {rows[0]['ranks'] if rows else 0} rank(s): {dict(by)}")
if secs:
    print(f"seconds per case: min {secs[0]}, median {secs[len(secs)//2]}, max {secs[-1]}")
PY
