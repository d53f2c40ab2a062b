#!/usr/bin/env bash
# The GPU runs behind the probe's acceptance, in one device call: the probe (quick and full,
# timed), the all-reduce correctness sweep (every power-of-two size from 4 B to 1 GiB, plus
# odd sizes, with 1, 2, 4 and 8 ranks on one GPU), and the benchmark table.
# usage: benches/h200.sh BINARY OUTDIR [sweep|probe|all]
set -uo pipefail
bin=$1
out=$2
what=${3:-all}
export NCCL_NVLS_ENABLE=0   # never NVLink multicast on shared machines
mkdir -p "$out"

# The worker finds NCCL and NVRTC by their plain names, as `gpubake probe` arranges it.
shim=$(mktemp -d)
nccl=$(ls /opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 2>/dev/null | head -1)
nvrtc=$(ls /usr/local/cuda/lib64/libnvrtc.so.* 2>/dev/null | grep -v builtins | head -1)
[ -n "$nccl" ] && ln -s "$nccl" "$shim/libnccl.so"
[ -n "$nvrtc" ] && ln -s "$nvrtc" "$shim/libnvrtc.so"
export LD_LIBRARY_PATH="$shim:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"

if [ "$what" = probe ] || [ "$what" = all ]; then
  /usr/bin/time -f "probe --quick: %e s" "$bin" probe --quick --json > "$out/probe-quick.json"; echo "exit $?"
  /usr/bin/time -f "probe: %e s" "$bin" probe --json --junit "$out/probe.xml" > "$out/probe.json"; echo "exit $?"
  "$bin" probe --quick | tail -30
fi

if [ "$what" = sweep ] || [ "$what" = all ]; then
  sizes=4
  s=4; while [ $s -lt 1073741824 ]; do s=$((s * 2)); sizes="$sizes,$s"; done
  sizes="$sizes,12,20,1000004,123456788"
  for r in 1 2 4 8; do
    /usr/bin/time -f "sweep ranks=$r: %e s" "$bin" probe-worker --devices 0 allreduce --ranks-per-gpu $r \
      --sizes "$sizes" --check-only > "$out/sweep-r$r.json"
    python3 - "$out/sweep-r$r.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
if "error" in d: print("ERROR", d["error"]); sys.exit()
rows = d["ok"]["rows"]
bad = [r for r in rows if r["wrong"]]
print(f"  {len(rows)} cases, {sum(r['checked'] for r in rows)} elements, {len(bad)} with differences")
for r in bad[:5]: print("  ", r)
PY
  done
fi

if [ "$what" = bench ] || [ "$what" = all ]; then
  "$bin" probe-worker --devices 0 allreduce --ranks-per-gpu 4 \
    --sizes 1024,16384,262144,4194304,67108864,268435456,1073741824 --iters 20 --nccl > "$out/bench-r4.json"
  "$bin" probe-worker --devices 0 allreduce --ranks-per-gpu 1 \
    --sizes 1024,16384,262144,4194304,67108864,268435456,1073741824 --iters 20 --nccl > "$out/bench-r1.json"
  for f in "$out"/bench-r4.json "$out"/bench-r1.json; do
  python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
if "error" in d: print("ERROR", d["error"]); sys.exit()
d = d["ok"]
print(f"copy {d['copy_gbps']:.0f} GB/s (read+write); nvrtc {d['nvrtc']}")
print(f"{'dtype':5} {'algo':9} {'ranks':>5} {'bytes':>11} {'us':>9} {'busbw':>7} {'local':>7} {'nccl us':>9} {'nccl bw':>8} ok")
for r in d["rows"]:
    f = lambda k, fmt: (fmt % r[k]) if r.get(k) is not None else "-"
    print(f"{r['dtype']:5} {r['algo']:9} {r['ranks']:5} {r['bytes']:11} {f('time_us','%9.1f')} {f('busbw','%7.1f')} {f('local_gbps','%7.0f')} {f('nccl_time_us','%9.1f')} {f('nccl_busbw','%8.1f')} {r['wrong']==0}")
PY
  done
fi
