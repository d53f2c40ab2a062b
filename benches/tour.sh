#!/usr/bin/env bash
# The README's tour, run whole on this machine, its raw output kept: examples/debian-pytorch2.9.yaml
# on scripts/make-debian-base's bookworm base, release binary.
#   resolve; a cold build (empty wheel cache) into layout C; a fresh layout A with the wheels
#   cached; A again; a fresh layout B; the recipe with one more pip package (six) into A;
#   skopeo's reading of B; the build into the Docker Engine, and in that image `import torch`
#   (stdout and stderr both: a warning torch prints is part of the tour) and the commands on
#   PATH.
# usage: benches/tour.sh OUT.txt [WORKDIR]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "$1")
work=${2:-$root/target/bench-tour}
bin=$root/target/release/gpubake
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 3; }
mkdir -p "$work"
cd "$work"
[ -f base/index.json ] || "$root/scripts/make-debian-base" ./base >/dev/null
cp "$root/examples/debian-pytorch2.9.yaml" r.yaml
sed 's/^  - tqdm==4.67.1$/  - tqdm==4.67.1\n  - six==1.17.0/' r.yaml >r6.yaml
sed -i 's/^name: debian-train$/name: debian-train-six/' r6.yaml
export GPUBAKE_CACHE_DIR=$work/cache
rm -rf cache A B C

t() {
  local s
  s=$(date +%s.%N)
  "$@" 2>&1 | tr '\r' '\n' | grep -v '^\s*$' | grep -v '\['
  echo "rc ${PIPESTATUS[0]}; wall $(echo "$(date +%s.%N) - $s" | bc) s"
}
{
  echo "# benches/tour.sh; commit $(git -C "$root" rev-parse --short HEAD); $(nproc) cores; $(date -u +%FT%TZ)"
  echo "== resolve"; t "$bin" resolve r.yaml -o r.lock
  t "$bin" resolve r6.yaml -o r6.lock
  echo "== 0: cold, layout C"; t "$bin" build r.yaml --from oci:./base:bookworm --to oci:./C:v1
  echo "== 1: fresh layout A"; t "$bin" build r.yaml --from oci:./base:bookworm --to oci:./A:v1
  echo "== 2: layout A again"; t "$bin" build r.yaml --from oci:./base:bookworm --to oci:./A:v1
  echo "== 3: fresh layout B"; t "$bin" build r.yaml --from oci:./base:bookworm --to oci:./B:v1
  echo "== 4: recipe with six added, into layout A"; t "$bin" build r6.yaml --from oci:./base:bookworm --to oci:./A:six
  echo "== skopeo inspect oci:./B:v1"
  skopeo inspect oci:./B:v1 | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['Digest'], len(d['Layers']), 'layers')"
  echo "== 5: into the Docker Engine"; t "$bin" build r.yaml --from oci:./base:bookworm --to docker-daemon:gpubake-tour:v1
  echo "== docker run: import torch"
  t docker run --rm gpubake-tour:v1 python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version())"
  echo "== docker run: commands"
  t docker run --rm gpubake-tour:v1 sh -c 'for c in python3 gpubake torchrun; do command -v "$c"; done'
  docker rmi -f gpubake-tour:v1 >/dev/null 2>&1
} | tee "$out"
