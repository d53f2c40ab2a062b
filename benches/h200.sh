#!/usr/bin/env bash
# The GPU runs behind the probe's acceptance, in one device call: the probe (quick and full,
# timed), the all-reduce correctness sweep (every power-of-two size from 4 B to 1 GiB plus
# odd sizes), and the benchmark table of the bundled kernel beside NCCL.
# usage: benches/h200.sh BINARY OUTDIR STAGE...   (stages: probe sweep bench presets)
# env:   DEVICES=0,1     GPUs to use (default 0)
#        SWEEP_RPG="1 2 4 8"  ranks per GPU for the sweep
#        BENCH_RPG="4 1"      ranks per GPU for the benchmark
#        TOP=1073741824       largest message of the sweep and the benchmark
# Changes nothing on the host: what it makes lives in a private temporary directory, removed
# on exit, and the host's /etc/nccl.conf is read, never moved or removed.
set -uo pipefail
bin=$1
out=$2
shift 2
devices=${DEVICES:-0}
ngpu=$(echo "$devices" | tr ',' '\n' | wc -l)
# The worker takes GPUs by PCI address: CUDA's ordinals need not follow nvidia-smi's indices.
addresses=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "$devices" | paste -sd, -)
. "$(dirname "$0")/lib.sh"
mkdir -p "$out"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# NCCL reads $NCCL_CONF_FILE (in place of ~/.nccl.conf), then /etc/nccl.conf, and never lets a
# later file replace a value already set: an empty private file keeps ~/.nccl.conf out.
: >"$work/nccl.conf"

lib_shim "$work/shim"
# worker FILE ARGS...: runs the worker, its JSON result into FILE, and says how long it took.
worker() {
  local file=$1; shift
  local start=$SECONDS
  LD_LIBRARY_PATH="$SHIM_PATH" "$bin" probe-worker --pci-bus-ids "$addresses" --result "$file" "$@" >/dev/null
  echo "  $(basename "$file"): $((SECONDS - start)) s"
}

summary() {
  python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
if "error" in d: print("  ERROR", d["error"]); sys.exit()
d = d["ok"]
rows = d["rows"]
if all(r.get("time_us") is None for r in rows):
    bad = [r for r in rows if r["wrong"]]
    print(f"  {sys.argv[1].split('/')[-1]}: {len(rows)} cases, {sum(r['checked'] for r in rows)} elements, {len(bad)} with differences")
    for r in bad[:5]: print("   ", r)
    sys.exit()
print(f"  {sys.argv[1].split('/')[-1]}: copy {d['copy_gbps']:.0f} GB/s (read+write); nvrtc {d['nvrtc']}")
print(f"  {'dtype':5} {'algo':9} {'ranks':>5} {'bytes':>11} {'us':>9} {'busbw':>7} {'local':>6} {'nccl us':>9} {'nccl bw':>8} ok")
for r in rows:
    f = lambda k, fmt: (fmt % r[k]) if r.get(k) is not None else "-"
    print(f"  {r['dtype']:5} {r['algo']:9} {r['ranks']:5} {r['bytes']:11} {f('time_us','%9.1f')} {f('busbw','%7.1f')} {f('local_gbps','%6.0f')} {f('nccl_time_us','%9.1f')} {f('nccl_busbw','%8.1f')} {r['wrong']==0}")
PY
}

# 1 KiB to TOP: 16x steps to 64 MiB, then 4x, TOP included.
ladder() {
  local top=${TOP:-1073741824} list=""
  for s in 1024 16384 262144 4194304 67108864 268435456 1073741824 4294967296; do
    [ "$s" -le "$top" ] && list="$list,$s"
  done
  echo "${list#,}"
}

# NCCL alone under one preset: preset NAME VAR=VALUE...
preset() {
  local name=$1; shift
  ( export NCCL_CONF_FILE=$work/nccl.conf
    for kv in "$@"; do export "${kv?}"; done
    worker "$out/nccl-${ngpu}gpu-$name.json" nccl --sizes "$(ladder)" --iters 20 )
}

for stage in "$@"; do
  case $stage in
  probe)
    /usr/bin/time -f "  probe --quick: %e s" "$bin" probe --quick --devices "$devices" --json > "$out/probe-quick-${ngpu}gpu.json"
    /usr/bin/time -f "  probe: %e s" "$bin" probe --devices "$devices" --json --junit "$out/probe-${ngpu}gpu.xml" > "$out/probe-${ngpu}gpu.json"
    "$bin" probe --quick --devices "$devices" | grep -v "^  PASS" ;;
  sweep)
    sizes=4; s=4
    while [ $s -lt "${TOP:-1073741824}" ]; do s=$((s * 2)); sizes="$sizes,$s"; done
    sizes="$sizes,12,20,1000004,123456788"
    for r in ${SWEEP_RPG:-1 2 4 8}; do
      worker "$out/sweep-${ngpu}gpu-${r}rpg.json" allreduce --ranks-per-gpu "$r" --sizes "$sizes" --check-only
      summary "$out/sweep-${ngpu}gpu-${r}rpg.json"
    done ;;
  bench)
    for r in ${BENCH_RPG:-4 1}; do
      worker "$out/bench-${ngpu}gpu-${r}rpg.json" allreduce --ranks-per-gpu "$r" \
        --sizes "$(ladder)" --iters 20 --nccl
      summary "$out/bench-${ngpu}gpu-${r}rpg.json"
    done ;;
  presets)
    # Each run sees only its own settings and NVLink multicast off. NCCL reads /etc/nccl.conf
    # whatever NCCL_CONF_FILE says, for every variable a run leaves unset, and it is the
    # host's: with settings in it (lines with `=` not starting with `#`, as NCCL reads them)
    # the runs would not be the presets they are named after, so the stage is skipped.
    host_conf=$(grep -s '=' /etc/nccl.conf | grep -v '^#' | cut -d= -f1 | paste -sd' ' -)
    if [ -n "$host_conf" ]; then
      echo "presets: skipped: /etc/nccl.conf sets $host_conf, which NCCL would apply to every run;" \
        "run this stage where the host has no /etc/nccl.conf settings" >&2
      continue
    fi
    preset defaults
    preset nvlink NCCL_CUMEM_ENABLE=1 NCCL_DEBUG=WARN NCCL_P2P_LEVEL=NVL "NCCL_SOCKET_IFNAME=^docker,lo,veth"
    preset forced NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=4 NCCL_P2P_LEVEL=PIX
    python3 - "$out" "$ngpu" <<'PY'
import json, sys
out, n = sys.argv[1], sys.argv[2]
runs = {}
for name in ["defaults", "nvlink", "forced"]:
    d = json.load(open(f"{out}/nccl-{n}gpu-{name}.json"))
    runs[name] = d.get("ok", {}).get("rows") or d.get("error")
print(f"  {'bytes':>11} " + " ".join(f"{k:>16}" for k in runs))
for i, r in enumerate(runs["defaults"] if isinstance(runs["defaults"], list) else []):
    cells = []
    for k, rows in runs.items():
        cells.append(f"{rows[i]['busbw']:7.1f} GB/s {rows[i]['time_us']:7.0f}us"[:16] if isinstance(rows, list) else "error")
    print(f"  {r['bytes']:11} " + " ".join(f"{c:>16}" for c in cells))
PY
    ;;
  esac
done
