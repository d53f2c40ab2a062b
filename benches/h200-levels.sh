#!/usr/bin/env bash
# The probe's levels on a GPU machine, each timed against its hard budget: level 1 three
# times, level 2 once on the machine's PyTorch, and level 3 (the burn) with the silent
# corruption test hook on CUDA device 0, once a one-off fault and once a repeated one
# (`short`), or level 3 for BURN seconds (`burn`).
# Prints a table (level, wall seconds, budget, exit code, failed checks) and keeps each
# report's JSON, stderr and metrics, packed in OUTDIR/levels-WHAT.tar.gz, and the table in
# OUTDIR/levels-WHAT.txt.
# usage: benches/h200-levels.sh short|burn OUTDIR [BURN]
#   GPUBAKE: the binary to run; EMIT=0 leaves out --emit.
set -uo pipefail
here=$(dirname "$0")
. "$here/lib.sh"
what=$1
dest=$(realpath -m "$2")
burn=${3:-300}
out=$(mktemp -d)/levels-$what
mkdir -p "$out" "$dest"
exec > >(tee "$dest/levels-$what.txt") 2>&1
bin=${GPUBAKE:-target/release/gpubake}
python=$(ls /opt/*/.venv/bin/python3 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
echo "python: ${python:-none}"
rows=()

# emit NAME: the --emit flags for run NAME, unless EMIT=0.
emit() {
  [ "${EMIT:-1}" = 0 ] || echo "--emit prometheus:$out/$1.prom --emit nfd:$out/$1.nfd"
}

# run NAME BUDGET ARGS...: one probe, timed from outside.
run() {
  local name=$1 budget=$2
  shift 2
  local t0 t1 code
  t0=$(date +%s.%N)
  "$bin" probe --json "$@" >"$out/$name.json" 2>"$out/$name.err"
  code=$?
  t1=$(date +%s.%N)
  local wall failed
  wall=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
  failed=$(python3 - "$out/$name.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no report: {e}"); sys.exit()
bad = [f"{c['phase']}/{c['name']}" for c in d["checks"] if c["status"] == "FAIL"]
print("; ".join(bad) or "-")
PY
)
  rows+=("$(printf '%-22s %8s %8s %5s  %s' "$name" "$wall" "$budget" "$code" "$failed")")
}

if [ "$what" = short ]; then
  # shellcheck disable=SC2046 # emit's flags are words
  for i in 1 2 3; do run "level1-$i" 10 --level 1 $(emit "level1-$i"); done
  # shellcheck disable=SC2046
  run level2 120 --level 2 ${python:+--python "$python"} $(emit level2)
  export GPUBAKE_TEST_CORRUPT_GEMM=0
  # shellcheck disable=SC2046
  run level3-corrupt-20s 200 --level 3 --burn-seconds 20 ${python:+--python "$python"} $(emit level3-corrupt-20s)
  # The same wrong element in every result, outside the CPU's tiles: only the check of the
  # whole product can see it.
  export GPUBAKE_TEST_CORRUPT_GEMM=0:4000:5000
  # shellcheck disable=SC2046
  run level3-repeated-20s 200 --level 3 --burn-seconds 20 ${python:+--python "$python"} $(emit level3-repeated-20s)
  unset GPUBAKE_TEST_CORRUPT_GEMM
else
  # shellcheck disable=SC2046
  run "level3-${burn}s" $((120 + burn + 60)) --level 3 --burn-seconds "$burn" \
    ${python:+--python "$python"} $(emit level3)
fi

printf '%-22s %8s %8s %5s  %s\n' run wall_s budget_s exit failed
printf '%s\n' "${rows[@]}"
for f in "$out"/level3*.json; do
  [ -e "$f" ] || continue
  echo "== $(basename "$f")"
  python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for c in d["checks"]:
    if c["phase"] in ("burn", "budget"):
        print(f"  {c['status']:4}  {c['name']}: {c['detail']}")
for g in d["facts"].get("burn", []):
    print("  facts:", {k: g.get(k) for k in ("index", "name", "tflops_median", "tflops_min", "sm_mhz_median", "sm_mhz_min", "power_w_max", "temperature_c_max", "samples", "throttle", "gemms", "seconds")})
PY
done
tar -czf "$dest/levels-$what.tar.gz" -C "$(dirname "$out")" "levels-$what"
