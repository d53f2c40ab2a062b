#!/usr/bin/env bash
# The README's image (examples/debian-pytorch2.9.yaml on scripts/make-debian-base's base) as a
# CI pipeline meets it: the static checks (`certify --gpus none`), the full `verify` and
# `inspect --libraries` on the layout, then pushed to a registry of its own (Debian's
# docker-registry on 127.0.0.1, plain HTTP), certified and signed there, and the CI gate
# (`verify --certified --static-ok --key`) against the full re-hash (`--blobs`) and against
# `skopeo inspect --raw`, the floor of asking a registry anything. Prints a table; the raw
# timings go to OUT. Wheels come from (and stay in) the user's gpubake cache.
# usage: benches/certify-gate.sh GPUBAKE OUT [ROUNDS]
set -euo pipefail
gpubake=$(realpath "$1")
out=$2
rounds=${3:-3}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
registry_pid=
cleanup() {
  [ -n "$registry_pid" ] && kill "$registry_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
: >"$out"

timed() { # NAME CMD...: one timed run, its seconds to OUT; the command's exit is kept
  local name=$1 start end rc=0
  shift
  start=$(date +%s.%N)
  "$@" >"$work/last.out" 2>"$work/last.err" || rc=$?
  end=$(date +%s.%N)
  echo "$name $(echo "$end - $start" | bc) exit=$rc" | tee -a "$out"
}

echo "# $(date -u +%FT%TZ) $(uname -m), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; $("$gpubake" --version)" | tee -a "$out"
"$repo/scripts/make-debian-base" "$work/base" >/dev/null
"$gpubake" resolve "$repo/examples/debian-pytorch2.9.yaml" --from "oci:$work/base:bookworm" \
  -o "$work/debian.lock" >/dev/null 2>&1
timed build "$gpubake" build "$repo/examples/debian-pytorch2.9.yaml" \
  --pylock "$work/pylock.debian-train.toml" --from "oci:$work/base:bookworm" \
  --to "oci:$work/image:v1"
du -sb "$work/image/blobs" | awk '{printf "# image: %.1f GB of blobs\n", $1/1e9}' | tee -a "$out"

for round in $(seq "$rounds"); do
  timed "certify-static-$round" "$gpubake" certify "oci:$work/image:v1" --gpus none
  grep -E "^# [0-9]+ passed" "$work/last.out" | sed 's/^/# /' >>"$out" || true
done
timed verify-layout "$gpubake" verify "oci:$work/image:v1"
timed inspect-libraries "$gpubake" inspect --libraries "oci:$work/image:v1"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
host=127.0.0.1:$port
cat >"$work/config.yml" <<EOF
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $work/data}}
http: {addr: $host, secret: bench}
EOF
docker-registry serve "$work/config.yml" >>"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
image=docker://$host/team/train:v1
"$gpubake" key generate --output-prefix "$work/ci" >/dev/null 2>&1 </dev/null
timed push "$gpubake" copy "oci:$work/image:v1" "$image"
timed certify-attach "$gpubake" certify "$image" --gpus none --attach --key "$work/ci.key"
for round in $(seq "$rounds"); do
  timed "gate-$round" "$gpubake" verify "$image" --certified --static-ok --key "$work/ci.pub"
  timed "gate-blobs-$round" "$gpubake" verify "$image" --certified --static-ok --key "$work/ci.pub" --blobs
  timed "skopeo-inspect-raw-$round" skopeo inspect --raw --tls-verify=false "$image"
done

python3 - "$out" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+?)(?:-(\d+))? ([0-9.]+) exit=(\d+)", line)
    if m:
        rows.setdefault(m.group(1), []).append((float(m.group(3)), m.group(4)))
print(f"{'step':<20} {'median s':>9} {'runs':>5}  exits")
for name, runs in rows.items():
    times = [t for t, _ in runs]
    print(f"{name:<20} {statistics.median(times):>9.2f} {len(runs):>5}  {','.join(e for _, e in runs)}")
gate = rows.get("gate"); floor = rows.get("skopeo-inspect-raw")
if gate and floor:
    g = statistics.median(t for t, _ in gate); f = statistics.median(t for t, _ in floor)
    print(f"gate / skopeo inspect --raw: {g / f:.1f}x")
PY
