#!/usr/bin/env bash
# A fresh OCI layout of the README's image with its wheels and layers cached (row 4 of
# benches/stack.sh): examples/debian-pytorch2.9.yaml (PyTorch 2.9.1 with its CUDA 12.8 wheels,
# NumPy, tqdm: 27 wheels, 4.1 GB) on the Debian base scripts/make-debian-base makes, each blob
# placed from gpubake's layer cache by the default (reflink where the filesystem clones files,
# else a copy) and by `--link-blobs` (hard links), pair by pair in one run, the order
# alternating. Every run starts with the page cache dropped (where the machine lets it) and
# the previous layout removed, and is checked by `gpubake verify`. Prints one line per run and
# a table of medians; the raw log goes beside OUT.
# usage: benches/placement.sh OUT.txt [REPS [WORKDIR]]   (release build, bc)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "$1")
reps=${2:-3}
work=$(realpath -m "${3:-$root/target/bench-stack}")
bin=$root/target/release/gpubake
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 3; }
command -v bc >/dev/null || { echo "benches/placement.sh: bc is not installed" >&2; exit 3; }
mkdir -p "$work"
cd "$work"
log=$out.log
: >"$log"
say() { echo "placement.sh: $*" >&2; }
export GPUBAKE_CACHE_DIR=$work/cache

[ -f base/index.json ] || "$root/scripts/make-debian-base" ./base >/dev/null
cp "$root/examples/debian-pytorch2.9.yaml" r.yaml
"$bin" resolve r.yaml -o r.lock >>"$log" 2>&1
say "filling the cache (wheels and layers), once"
rm -rf fill
"$bin" build r.yaml --from oci:./base:bookworm --to oci:./fill:v1 >>"$log" 2>&1
rm -rf fill

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
# One fresh layout; prints its seconds and, from --json, how its layers were placed.
fresh() { # MODE
  local extra=() s e
  [ "$1" = link ] && extra=(--link-blobs)
  rm -rf fresh
  drop_caches
  s=$(date +%s.%N)
  "$bin" build r.yaml --from oci:./base:bookworm --to oci:./fresh:v1 --json "${extra[@]}" \
    >fresh.json 2>>"$log"
  e=$(date +%s.%N)
  "$bin" verify oci:./fresh:v1 >>"$log" 2>&1 || { say "$1: the layout does not verify"; exit 1; }
  placed=$(python3 -c 'import json,sys,collections
c=collections.Counter(l.get("placed","-") for l in json.load(open("fresh.json"))["layers"])
print(" ".join(f"{k}:{v}" for k,v in sorted(c.items())))')
  printf '%.2f %s\n' "$(echo "$e - $s" | bc)" "$placed"
}

declare -A runs
fs=$(stat -f -c %T .)
{
  echo "# benches/placement.sh, $(date -u +%F), $(git -C "$root" rev-parse --short HEAD), filesystem $fs, $(nproc) cores"
  for i in $(seq "$reps"); do
    if [ $((i % 2)) = 1 ]; then order="default link"; else order="link default"; fi
    for mode in $order; do
      line=$(fresh "$mode")
      runs[$mode]+="${line%% *} "
      echo "run $i $mode: $line s"
    done
  done
  median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  d=$(echo "${runs[default]}" | median)
  l=$(echo "${runs[link]}" | median)
  echo
  printf '%-52s %9s %7s\n' "fresh OCI layout, wheels and layers cached" "median s" "x link"
  printf '%-52s %9s %7s\n' "default (reflink, else copy)" "$d" "$(printf '%.2f' "$(echo "$d / $l" | bc -l)")"
  printf '%-52s %9s %7s\n' "--link-blobs (hard links)" "$l" "1.00"
  echo "layout: $(du -sb fresh/blobs | cut -f1) bytes of blobs"
} | tee "$out"
rm -rf fresh fresh.json
