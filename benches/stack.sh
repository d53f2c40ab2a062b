#!/usr/bin/env bash
# The training image end to end: examples/debian-pytorch2.9.yaml (PyTorch 2.9.1, CUDA 12.8
# wheels, NumPy and tqdm: 27 wheels, 4.1 GB) on the Debian base that scripts/make-debian-base makes, built
#   1. cold: empty wheel cache (every wheel downloaded) and empty layout,
#   2. warm wheels: wheels cached, a fresh layout (every layer compressed again),
#   3. warm: the same layout again (every layer found in the cache),
#   4. by the Docker Engine from the rendered Dockerfile and its context (`--engine-build`),
# and prints a table: seconds, image size, layer count, and whether builds 1-3 gave one digest.
# usage: benches/stack.sh [WORKDIR]    (needs a release build, uv, umoci, mmdebstrap, docker)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/target/bench-stack}
bin=$root/target/release/gpubake
recipe=$root/examples/debian-pytorch2.9.yaml
mkdir -p "$work"
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 3; }
[ -f "$work/base/index.json" ] || "$root/scripts/make-debian-base" "$work/base" >/dev/null
cp "$recipe" "$work/recipe.yaml"
"$bin" resolve "$work/recipe.yaml" -o "$work/recipe.lock" 2>/dev/null

seconds() { local t0=$SECONDS; "$@" >"$work/last.log" 2>&1 || { cat "$work/last.log" >&2; exit 1; }; echo $((SECONDS - t0)); }
digest() { grep -o 'manifest sha256:[0-9a-f]*' "$work/last.log" | cut -d' ' -f2; }

export GPUBAKE_CACHE_DIR=$work/cache
rm -rf "$work/cache" "$work/out1" "$work/out2"
cold=$(seconds "$bin" build "$work/recipe.yaml" --from "oci:$work/base:bookworm" --to "oci:$work/out1:v1")
d1=$(digest)
warm_wheels=$(seconds "$bin" build "$work/recipe.yaml" --from "oci:$work/base:bookworm" --to "oci:$work/out2:v1")
d2=$(digest)
warm=$(seconds "$bin" build "$work/recipe.yaml" --from "oci:$work/base:bookworm" --to "oci:$work/out2:v1")
d3=$(digest)
size=$(du -sb "$work/out2/blobs" | cut -f1)
layers=$(grep -c 'sha256:' "$work/last.log")

engine=skipped
if docker info >/dev/null 2>&1; then
  skopeo copy --quiet "oci:$work/base:bookworm" docker-daemon:gpubake-bench-base:bookworm
  docker builder prune -af >/dev/null 2>&1 || true
  engine=$(seconds "$bin" build "$work/recipe.yaml" --engine-build \
    --from docker-daemon:gpubake-bench-base:bookworm --to docker-daemon:gpubake-bench-engine:v1)
  engine_size=$(docker image inspect gpubake-bench-engine:v1 --format '{{.Size}}')
  docker rmi -f gpubake-bench-engine:v1 gpubake-bench-base:bookworm >/dev/null
fi

printf '%-52s %8s\n' "build of $(basename "$recipe")" seconds
printf '%-52s %8s\n' "gpubake, cold (download + install + compress)" "$cold"
printf '%-52s %8s\n' "gpubake, wheels cached, new layout" "$warm_wheels"
printf '%-52s %8s\n' "gpubake, warm (every layer cached)" "$warm"
printf '%-52s %8s\n' "docker engine build of the rendered context" "$engine"
echo "gpubake image: $((size / 1000000)) MB compressed in $layers layers; docker's: $(( ${engine_size:-0} / 1000000 )) MB uncompressed"
echo "digests: $d1 $d2 $d3"
[ "$d1" = "$d2" ] && [ "$d2" = "$d3" ] && echo "one digest across the three builds" || { echo "DIGESTS DIFFER" >&2; exit 1; }
