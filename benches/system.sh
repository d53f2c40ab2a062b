#!/usr/bin/env bash
# The OS layer against mmdebstrap, on one machine in one run: the packages of
# examples/debian-multinode.yaml (rdma-core ibverbs-providers ibverbs-utils numactl
# openssh-client) on the Debian bookworm base that scripts/make-debian-base makes.
#   gpubake: `build --without-python` of the recipe with and without `system:`, .deb cache
#            empty (cold) and full (warm, layer cache off); the difference is the system
#            layer's resolve (InRelease, Packages, solve), download, unpack and compression.
#            Then the resolve alone (`resolve --from`) and a warm build from its lock
#            (`build --lock`), which splits the difference into its two halves.
#   mmdebstrap: `--variant=minbase` of bookworm with and without `--include` of the same
#            packages (apt downloads, dpkg unpacks and configures, into a tarball); the
#            difference is what the packages cost it. Its own apt cache starts empty each time.
# Prints a table of seconds, each the best of RUNS (default 3).
# usage: benches/system.sh [WORKDIR]    (needs a release build, mmdebstrap, umoci)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/target/bench-system}
runs=${RUNS:-3}
bin=$root/target/release/gpubake
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 3; }
mkdir -p "$work"
[ -f "$work/base/index.json" ] || "$root/scripts/make-debian-base" "$work/base" >/dev/null
packages=$(sed -n 's/^system: \[\(.*\)\]$/\1/p' "$root/examples/debian-multinode.yaml" | tr -d ' ')
printf 'name: sys\nbase: debian:bookworm\npython: "3.11"\npytorch: "2.9"\npresets: [base]\n' >"$work/none.yaml"
{ cat "$work/none.yaml"; echo "system: [$packages]"; } >"$work/with.yaml"

# best CMD...: the fewest seconds (to 0.01) of $runs runs.
best() {
  local b="" t
  for _ in $(seq "$runs"); do
    [ -n "${before:-}" ] && eval "$before"
    local t0; t0=$(date +%s.%N)
    "$@" >"$work/last.log" 2>&1 || { cat "$work/last.log" >&2; exit 1; }
    t=$(echo "$(date +%s.%N) - $t0" | bc)
    if [ -z "$b" ] || [ "$(echo "$t < $b" | bc)" = 1 ]; then b=$t; fi
  done
  printf '%.2f' "$b"
}

build() { rm -rf "$work/out"; "$bin" build --without-python "$1" --no-cache \
  --from "oci:$work/base:bookworm" --to "oci:$work/out:v1"; }
export GPUBAKE_CACHE_DIR=$work/cache
before='rm -rf "$work/cache"'
g_none=$(best build "$work/none.yaml")
g_cold=$(best build "$work/with.yaml")
before=''
g_warm=$(best build "$work/with.yaml")
layer=$(grep -o 'system .*' "$work/last.log" | awk '{print $3, $4}')
# The resolve alone (InRelease verified, Packages fetched and checked, the solve), and a warm
# build from its lock, which resolves nothing: fetch from the cache, unpack, compress, write.
resolve() { "$bin" resolve "$1" --no-closure --from "oci:$work/base:bookworm" -o "$work/$2.lock"; }
r_none=$(best resolve "$work/none.yaml" none)
r_with=$(best resolve "$work/with.yaml" with)
locked() { rm -rf "$work/out"; "$bin" build --without-python "$1" --no-cache --lock "$work/$2.lock" \
  --from "oci:$work/base:bookworm" --to "oci:$work/out:v1"; }
l_none=$(best locked "$work/none.yaml" none)
l_with=$(best locked "$work/with.yaml" with)

debstrap() { rm -f "$work/root.tar"; mmdebstrap --quiet --variant=minbase \
  --include=python3,ca-certificates${1:+,$1} bookworm "$work/root.tar"; }
m_none=$(best debstrap "")
m_with=$(best debstrap "$packages")

pkgs=$("$bin" resolve "$work/with.yaml" --no-closure --json --from "oci:$work/base:bookworm" 2>/dev/null |
  python3 -c 'import json, sys; print(len(json.load(sys.stdin)["system"]))')
echo "system packages: $packages ($pkgs with their closure); layer $layer; best of $runs"
printf '| | without | with | the packages cost |\n|---|---:|---:|---:|\n'
printf '| gpubake build, .debs downloaded (cold) | %s | %s | %.2f |\n' "$g_none" "$g_cold" "$(echo "$g_cold - $g_none" | bc)"
printf '| gpubake build, .debs cached (warm) | %s | %s | %.2f |\n' "$g_none" "$g_warm" "$(echo "$g_warm - $g_none" | bc)"
printf '| gpubake resolve --from (InRelease, Packages, solve) | %s | %s | %.2f |\n' "$r_none" "$r_with" "$(echo "$r_with - $r_none" | bc)"
printf '| gpubake build --lock, .debs cached (unpack, compress, write) | %s | %s | %.2f |\n' "$l_none" "$l_with" "$(echo "$l_with - $l_none" | bc)"
printf '| mmdebstrap --variant=minbase (apt, dpkg) | %s | %s | %.2f |\n' "$m_none" "$m_with" "$(echo "$m_with - $m_none" | bc)"
