#!/usr/bin/env bash
# The same lock and base give the same image before and after a change: OLD and NEW gpubake
# binaries build examples/debian-pytorch2.9.yaml on scripts/make-debian-base's base into fresh
# layouts, each from an empty layer cache with the same wheels (hard links of WORK/cache's),
# NEW with OLD as its probe (the probe layer holds the building binary itself); then NEW into a
# second fresh layout (its layers from the cache) and into the Docker Engine, whose image ID
# must be the layouts' config.
# usage: benches/digests-before-after.sh OLD NEW [WORK]   (WORK as benches/stack.sh leaves it)
set -euo pipefail
old=$(realpath "$1")
new=$(realpath "$2")
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(realpath -m "${3:-$root/target/bench-stack}")
cd "$work"
[ -f base/index.json ] || "$root/scripts/make-debian-base" ./base >/dev/null
cp "$root/examples/debian-pytorch2.9.yaml" r.yaml
for who in old new; do
  rm -rf "dcache-$who" "D-$who"
  mkdir -p "dcache-$who/wheels"
  [ -d cache/wheels ] && cp -al cache/wheels/. "dcache-$who/wheels/"
done
trap 'rm -rf dcache-old dcache-new D-old D-new D-new2; docker rmi -f gp-digest:v1 >/dev/null 2>&1 || true' EXIT
echo "# OLD = $old, NEW = $new (the repository at $(git -C "$root" rev-parse --short HEAD))"
echo "# both with OLD in the probe layer; each from an empty layer cache, the same wheels"
build() {  # WHO BINARY DEST [ARGS]
  local who=$1 bin=$2 dest=$3
  shift 3
  GPUBAKE_CACHE_DIR=$work/dcache-$who "$bin" build r.yaml --from oci:./base:bookworm --to "$dest" "$@" 2>/dev/null
}
echo '$ OLD build r.yaml --to oci:D-old:v1'
build old "$old" oci:./D-old:v1 | grep -E '^built|manifest'
echo '$ NEW build r.yaml --to oci:D-new:v1 --probe-binary linux/amd64=OLD'
build new "$new" oci:./D-new:v1 --probe-binary "linux/amd64=$old" | grep -E '^built|manifest'
echo '$ NEW, the same into a second fresh layout (layers from its cache)'
build new "$new" oci:./D-new2:v1 --probe-binary "linux/amd64=$old" | grep -E '^built|manifest'
if docker info >/dev/null 2>&1; then
  echo '$ NEW, the same into the engine (docker-daemon:gp-digest:v1)'
  build new "$new" docker-daemon:gp-digest:v1 --probe-binary "linux/amd64=$old" --json |
    python3 -c "import json,sys; d=json.load(sys.stdin); print('  config', d['config'], 'engine', d['engine'])"
  echo "  docker image ID $(docker image inspect -f '{{.Id}}' gp-digest:v1)"
  python3 - <<'PY'
import json
index = json.load(open("D-new/index.json"))
digest = index["manifests"][0]["digest"].split(":")[1]
print("  layout config  ", json.load(open(f"D-new/blobs/sha256/{digest}"))["config"]["digest"])
PY
fi
