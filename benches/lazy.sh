#!/usr/bin/env bash
# A fresh node, from the first byte of the pull to the end of the job's start-up, for the
# README's torch image (examples/debian-pytorch2.9.yaml on scripts/make-debian-base's base) in
# each layout a node can be given:
#   A   gzip, pulled whole and unpacked by containerd's overlayfs (gpubake's default)
#   B   zstd, the same way
#   Bu  uncompressed (the layers' tar), the same way
#   C   eStargz, no prefetch, mounted lazily by the stargz snapshotter
#   D   eStargz laid out by the image's own start-up record (build --startup-record)
#   Dw  as D, with every recorded file prefetched whole (the record with read = size)
#   E   C as `ctr-remote image optimize` rewrites it, running W1 in the image
#   Z   A as `ctr-remote image convert --zstdchunked` rewrites it: zstd:chunked, no prefetch
#   Cz  zstd:chunked as gpubake writes it, no prefetch (build --compression zstd:chunked)
#   Dz  Cz laid out by the image's own start-up record, as D
# and each workload:
#   W1  python3 -c "import torch"
#   W2  the GPU start-up a record holds, replayed without a GPU (benches/lazy/replay.py): each
#       file the record names read in its order, whole or in scattered pages as recorded
#   W3  W1, then every file of the image read
# RECIPE=FILE builds another image than the README's (BASE_TAG=noble: on Ubuntu 24.04's
# base); RECORD=FILE lays D, Dw and Dz out by that start-up record (taken on a GPU node),
# restricted to the files the image holds, instead of recording the import in the image, and
# is what W2 replays.
# Registry (docker-registry), containerd and the snapshotter (tests/stargz-daemon, built from
# Debian's source) run in a network namespace of their own whose loopback `tbf` holds to
# RATE. Every repetition starts from a wipe of containerd's and the snapshotter's roots and
# dropped page caches (the registry's files stay cached: it stands for a remote registry),
# and is timed from the start of the pull to the end of the workload; the bytes are what the
# registry's log says it served. Prints one line per repetition and a table of medians with
# the spread; the raw lines, the logs and the snapshotter's config go to OUTDIR.
# usage: benches/lazy.sh BINARY OUTDIR [RATE [REPS [ROWS [WORKLOADS]]]]
#        defaults: 1gbit 3 "A B C D Dw E Z Cz Dz" "W1 W3"; WORK=DIR keeps the images between runs,
#        RECIPE, BASE_TAG and RECORD as above,
#        BUILD_ONLY=1 builds them and stops.
# Needs root, /dev/fuse, containerd, ctr, ctr-remote, runc, docker-registry, tc, Go with the
# snapshotter's library source, and the Docker Engine (to record the start-up in the image).
set -euo pipefail
bin=$(realpath "$1")
out=$(realpath -m "$2")
rate=${3:-1gbit}
reps=${4:-3}
rows=${5:-A B C D Dw E Z Cz Dz}
workloads=${6:-W1 W3}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(realpath -m "${WORK:-$root/target/bench-lazy}")
mkdir -p "$work" "$out"
ns=gpubake-lazy
# NO_BACKGROUND_FETCH=1: the snapshotter fetches only what is read (and the prefetch).
background=
[ "${NO_BACKGROUND_FETCH:-}" = 1 ] && background=-no-background-fetch
# SNAPSHOTTER_CONFIG=FILE: the snapshotter's config.toml, as a node's containerd-stargz-grpc
# reads it; without it, the service's defaults.
snapshotter_config=()
[ -n "${SNAPSHOTTER_CONFIG:-}" ] && snapshotter_config=(-config "$(realpath -e "$SNAPSHOTTER_CONFIG")")
# CPU_PROFILE=1: the snapshotter writes where it spent its CPU in each repetition, for
# `go tool pprof` (OUTDIR/stargz-WORKLOAD-ROW-REP.pprof).
[ "${CPU_PROFILE:-}" = 1 ] && snapshotter_config+=(-cpuprofile "$work/node/stargz.pprof")
NS="nsenter --net=/run/netns/$ns"
recipe=$(realpath -e "${RECIPE:-$root/examples/debian-pytorch2.9.yaml}")
base_tag=${BASE_TAG:-bookworm}
python=/opt/gpubake/venv/bin/python3
# W2's script and record reach the container by a read-only bind mount at /bench.
declare -A workload=(
  [W1]="$python -c 'import torch'"
  [W2]="$python /bench/replay.py /bench/record.json"
  [W3]="$python -c 'import torch' && find / -xdev -type f -print0 | xargs -0 cat >/dev/null"
)

say() { echo "lazy.sh: $*" >&2; }

# --- the snapshotter's daemon, from Debian's source of its library --------------------------
daemon=$work/stargz-daemon
if [ ! -x "$daemon" ] || [ "$daemon" -ot "$root/tests/stargz-daemon/main.go" ]; then
  say "building the stargz daemon"
  gp=$work/gopath
  rm -rf "$gp"
  mkdir -p "$gp/src/stargz-daemon" "$gp/src/github.com/containerd"
  cp "$root/tests/stargz-daemon/main.go" "$gp/src/stargz-daemon/"
  cp -r /usr/share/gocode/src/github.com/containerd/stargz-snapshotter "$gp/src/github.com/containerd/"
  # The CRI keychain needs Kubernetes' CRI API, which Debian lacks; the daemon needs no keychain.
  rm "$gp/src/github.com/containerd/stargz-snapshotter/service/resolver/cri.go"
  (cd "$gp/src/stargz-daemon" && GO111MODULE=off GOPATH="$gp:/usr/share/gocode" \
    GOCACHE="$work/gocache" go build -o "$daemon" .)
fi

# --- the images --------------------------------------------------------------------------
[ -f "$work/base/index.json" ] || "$root/scripts/make-debian-base" "$work/base" "$base_tag" >/dev/null
# The wheels benches/stack.sh and digests-before-after.sh fetched, when they are there.
if [ ! -d "$work/cache/wheels" ] && [ -d "$root/target/bench-stack/cache/wheels" ]; then
  mkdir -p "$work/cache"
  cp -al "$root/target/bench-stack/cache/wheels" "$work/cache/wheels"
fi
build() {  # TAG [ARGS]: the recipe's image into $work/img:TAG
  local tag=$1
  shift
  if ! grep -q "\"$tag\"" "$work/img/index.json" 2>/dev/null; then
    say "building $tag $*"
    GPUBAKE_CACHE_DIR=$work/cache "$bin" build "$recipe" \
      --from "oci:$work/base:$base_tag" --to "oci:$work/img:$tag" "$@" >"$work/build-$tag.log" 2>&1
  fi
}
needs() { case " $rows " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
build A
needs B && build B --compression zstd
needs Bu && build Bu --compression uncompressed
needs C || needs E && build C --compression estargz
needs Cz && build Cz --compression zstd:chunked
mkdir -p "$work/replay"
cp "$root/benches/lazy/replay.py" "$work/replay/"
if [ -n "${RECORD:-}" ] && [ ! -s "$work/startup.json" ]; then
  # The GPU record, less what the image does not install (other packages' metadata).
  say "restricting $RECORD to the image's files"
  python3 "$root/benches/lazy/filter-record.py" "$(realpath -e "$RECORD")" "$work/img" A \
    "$work/startup.json" >"$work/record-filter.txt" 2>&1 ||
    { cat "$work/record-filter.txt" >&2; rm -f "$work/startup.json"; exit 1; }
fi
[ -f "$work/record-filter.txt" ] && cp "$work/record-filter.txt" "$out/"
if needs D || needs Dw || needs Dz || [[ " $workloads " == *" W2 "* ]]; then
  if [ ! -s "$work/startup.json" ]; then
    # The start-up recorded where the job runs: in the image, by its own probe (no GPU here,
    # so the import alone).
    say "recording the start-up in the image"
    "$bin" copy "oci:$work/img:A" docker-daemon:gpubake-lazy:A >/dev/null
    docker run --rm -v "$work:/out" --entrypoint /usr/local/bin/gpubake gpubake-lazy:A \
      probe --quick --record-startup /out/startup.json >"$work/record.log" 2>&1 || true
    docker rmi gpubake-lazy:A >/dev/null 2>&1 || true
    [ -s "$work/startup.json" ] || { cat "$work/record.log" >&2; exit 1; }
  fi
  cp "$work/startup.json" "$out/startup.json"
  cp "$work/startup.json" "$work/replay/record.json"
  python3 - "$work/startup.json" "$work/startup-whole.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for f in r["files"]:
    f["read"] = f["size"]
json.dump(r, open(sys.argv[2], "w"), indent=1)
PY
  needs D && build D --compression estargz --startup-record "$work/startup.json"
  needs Dw && build Dw --compression estargz --startup-record "$work/startup-whole.json"
  needs Dz && build Dz --compression zstd:chunked --startup-record "$work/startup.json"
fi

[ "${BUILD_ONLY:-}" = 1 ] && exit 0

# --- the network namespace, the registry ---------------------------------------------------
cleanup() {
  stop_node
  # A daemon stopped by a signal ends with 128 + it: not this script's failure.
  [ -n "${registry_pid:-}" ] && { kill "$registry_pid"; wait "$registry_pid"; } 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  true
}
trap cleanup EXIT
ip netns del "$ns" 2>/dev/null || true
ip netns add "$ns"
$NS ip link set lo up
# The registry's blobs stay between runs (a push then sends nothing); its log starts afresh.
mkdir -p "$work/registry"
: >"$work/registry/log"
cat >"$work/registry/config.yml" <<EOF
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: $work/registry/data
http:
  addr: 127.0.0.1:5000
EOF
$NS docker-registry serve "$work/registry/config.yml" >>"$work/registry/log" 2>&1 &
registry_pid=$!
for _ in $(seq 100); do $NS curl -sf http://127.0.0.1:5000/v2/ >/dev/null && break; sleep 0.1; done
ref() { echo "127.0.0.1:5000/gpubake/lazy:$1"; }
for row in $rows; do
  case $row in E | Z) continue ;; esac
  say "pushing $row"
  $NS "$bin" copy "oci:$work/img:$row" "docker://$(ref "$row")" >/dev/null
done

# --- a node: containerd and, for lazy rows, the snapshotter, on fresh roots ----------------
node=$work/node
start_node() {  # LAZY (0|1)
  mkdir -p "$node/run"
  cat >"$node/containerd.toml" <<EOF
version = 2
root = "$node/containerd-root"
state = "$node/containerd-state"
[grpc]
  address = "$node/run/containerd.sock"
[ttrpc]
  address = "$node/run/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
[proxy_plugins]
  [proxy_plugins.stargz]
    type = "snapshot"
    address = "$node/run/stargz.sock"
EOF
  if [ "$1" = 1 ]; then
    # shellcheck disable=SC2086 # $background is one flag or none
    $NS "$daemon" -address "$node/run/stargz.sock" -root "$node/stargz-root" $background "${snapshotter_config[@]}" \
      >>"$node/stargz.log" 2>&1 &
    stargz_pid=$!
    for _ in $(seq 100); do [ -S "$node/run/stargz.sock" ] && break; sleep 0.1; done
  fi
  $NS containerd --config "$node/containerd.toml" >>"$node/containerd.log" 2>&1 &
  containerd_pid=$!
  for _ in $(seq 100); do ctr_ version >/dev/null 2>&1 && break; sleep 0.1; done
}
cpu_seconds() {  # PID: the user and system CPU time it has used so far
  if [ -z "$1" ] || [ ! -r "/proc/$1/stat" ]; then echo 0 && return; fi
  awk -v hz="$(getconf CLK_TCK)" '{sub(/.*\) /, ""); printf "%.1f", ($12 + $13) / hz}' "/proc/$1/stat"
}
stop_node() {
  [ -n "${stargz_pid:-}" ] && { kill -INT "$stargz_pid"; wait "$stargz_pid"; } 2>/dev/null || true
  [ -n "${containerd_pid:-}" ] && { kill "$containerd_pid"; wait "$containerd_pid"; } 2>/dev/null || true
  stargz_pid='' containerd_pid=''
  grep -o " ${node}[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf "$node"
}
ctr_() { $NS ctr --address "$node/run/containerd.sock" -n bench "$@"; }
ctr_remote() { $NS ctr-remote --address "$node/run/containerd.sock" -n bench "$@"; }

# Rows the snapshotter's own tool writes from a row gpubake pushed: E, ctr-remote's optimiser,
# which runs W1 in the image and puts what it read first (a quarter of an hour here: gzip
# level 9 on 2 cores), and Z, its zstd:chunked converter. A row already in the registry is
# kept. The image goes out by `ctr image export` and `gpubake copy`, which checks every blob
# it moves: `ctr image push` of it failed once with "unexpected EOF" and named nothing.
ctr_remote_row() {  # ROW SOURCE-ROW CTR-REMOTE-ARGS...: ROW made by ctr-remote from SOURCE-ROW
  local row=$1 source=$2
  shift 2
  needs "$row" || return 0
  if $NS curl -sf -o /dev/null -H "Accept: application/vnd.oci.image.manifest.v1+json" \
    "http://127.0.0.1:5000/v2/gpubake/lazy/manifests/$row"; then
    say "$row: already in the registry"
    return 0
  fi
  say "$row: ctr-remote $* of $source"
  $NS "$bin" copy "oci:$work/img:$source" "docker://$(ref "$source")" >/dev/null
  start_node 0
  rm -rf "${work:?}/$row"
  if ctr_ image pull --plain-http "$(ref "$source")" >"$work/ctr-remote-$row.log" 2>&1 &&
    ctr_remote "$@" "$(ref "$source")" "$(ref "$row")" >>"$work/ctr-remote-$row.log" 2>&1 &&
    mkdir "$work/$row" &&
    ctr_ image export - "$(ref "$row")" 2>>"$work/ctr-remote-$row.log" | tar -xf - -C "$work/$row" &&
    $NS "$bin" copy "oci:$work/$row" "docker://$(ref "$row")" >>"$work/ctr-remote-$row.log" 2>&1; then
    :
  else
    say "$row: ctr-remote or the push failed (see $work/ctr-remote-$row.log); row $row left out"
    rows=${rows/$row/}
  fi
  rm -rf "${work:?}/$row"
  stop_node
}
ctr_remote_row E C image optimize --oci --entrypoint "[\"$python\"]" --args '["-c","import torch"]'
ctr_remote_row Z A image convert --zstdchunked --oci

# --- the measurements -----------------------------------------------------------------------
$NS tc qdisc replace dev lo root tbf rate "$rate" burst 1mb latency 100ms
{
  echo "# $(date -u +%FT%TZ) rate $rate, $reps repetitions, $(nproc) cores, $(uname -r)"
  echo "# $("$bin" --version); containerd $(containerd --version | awk '{print $3}'); snapshotter: ${SNAPSHOTTER_CONFIG:-service defaults (prefetch timeout 10 s)}, background fetch ${background:-on}"
  echo "# workload row rep seconds bytes-served pull-seconds snapshotter-cpu-s containerd-cpu-s"
} | tee "$out/raw.txt"
[ -n "${SNAPSHOTTER_CONFIG:-}" ] && cp "$SNAPSHOTTER_CONFIG" "$out/snapshotter.toml"
bench_mount=(--mount "type=bind,src=$work/replay,dst=/bench,options=rbind:ro")
served_since() {  # LINE: bytes the registry served after line LINE of its log
  tail -n "+$(($1 + 1))" "$work/registry/log" | grep 'response completed' |
    grep -o 'http.response.written=[0-9]*' | awk -F= '{s += $2} END {printf "%.0f", s}'
}
for wl in $workloads; do
  for row in $rows; do
    lazy=0
    case $row in C | D | Dw | E | Z | Cz | Dz) lazy=1 ;; esac
    for rep in $(seq "$reps"); do
      stop_node
      sync
      echo 3 >/proc/sys/vm/drop_caches
      start_node "$lazy"
      mark=$(wc -l <"$work/registry/log")
      t0=$(date +%s.%N)
      # The pull's end splits the time: a lazy pull returns once the layers are resolved, and
      # the first container waits for their prefetch.
      if [ "$lazy" = 1 ]; then
        ctr_remote image rpull --plain-http "$(ref "$row")" >/dev/null
        tp=$(date +%s.%N)
        ctr_ run --rm --snapshotter stargz "${bench_mount[@]}" "$(ref "$row")" "b$rep" sh -c "${workload[$wl]}" >/dev/null
      else
        ctr_ image pull --plain-http "$(ref "$row")" >/dev/null
        tp=$(date +%s.%N)
        ctr_ run --rm "${bench_mount[@]}" "$(ref "$row")" "b$rep" sh -c "${workload[$wl]}" >/dev/null
      fi
      t1=$(date +%s.%N)
      bytes=$(served_since "$mark")
      awk -v wl="$wl" -v row="$row" -v rep="$rep" -v t0="$t0" -v tp="$tp" -v t1="$t1" -v b="$bytes" \
        -v sc="$(cpu_seconds "${stargz_pid:-}")" -v cc="$(cpu_seconds "$containerd_pid")" \
        'BEGIN {printf "%s %s %d %.2f %s %.2f %s %s\n", wl, row, rep, t1 - t0, b, tp - t0, sc, cc}' |
        tee -a "$out/raw.txt"
      if [ "${CPU_PROFILE:-}" = 1 ] && [ -n "${stargz_pid:-}" ]; then
        kill -INT "$stargz_pid" && wait "$stargz_pid" || true
        stargz_pid=''
        cp "$node/stargz.pprof" "$out/stargz-$wl-$row-$rep.pprof"
      fi
      cp "$node/stargz.log" "$out/stargz-$wl-$row-$rep.log" 2>/dev/null || true
    done
  done
done
stop_node

python3 - "$out/raw.txt" <<'PY' | tee "$out/table.md"
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if line.startswith("#"):
        continue
    wl, row, _, s, b, *split = line.split()
    rows.setdefault((wl, row), []).append((float(s), int(b), *map(float, split)))
base = {wl: statistics.median(x[0] for x in v) for (wl, row), v in rows.items() if row == "A"}
print("| workload | row | median s | min–max s | × A | MB served | pull s | snapshotter CPU s | containerd CPU s |")
print("|---|---|---|---|---|---|---|---|---|")
for (wl, row), v in rows.items():
    s = [x[0] for x in v]
    m = statistics.median(s)
    ratio = f"{m / base[wl]:.2f}" if wl in base else "–"
    mb = statistics.median(x[1] for x in v) / 1e6
    # Lines of runs before the split was recorded have none: a dash.
    split = [f"{statistics.median(x[i] for x in v):.1f}" if all(len(x) > i for x in v) else "–" for i in (2, 3, 4)]
    print(f"| {wl} | {row} | {m:.1f} | {min(s):.1f}–{max(s):.1f} | {ratio} | {mb:,.0f} | {' | '.join(split)} |")
PY
