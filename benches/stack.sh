#!/usr/bin/env bash
# The training image against the engine's own builders, in one run, pair by pair:
# examples/debian-pytorch2.9.yaml (PyTorch 2.9.1 with its CUDA 12.8 wheels, NumPy, tqdm: 27
# wheels, 4.1 GB) on the Debian base scripts/make-debian-base makes, built by gpubake and, from
# the same base, by a two-step Dockerfile (`uv venv` + `uv pip install torch==2.9.1` in one RUN,
# the extras in a second) with `docker build` (the engine's legacy builder) and `buildah bud`.
# Rows:
#   1. cold (no wheel, layer or builder cache; the engine holds the base only), into the engine
#   2. one more pip package (six==1.17.0) into the engine, after row 1
#   3. cold into a loopback registry (Debian's docker-registry, plain HTTP on 127.0.0.1):
#      gpubake against docker build + docker push and buildah bud + buildah push
#   4. a fresh OCI layout with the wheels and layers of row 3 cached, and with the wheels only
#   5. floors of the machine for the same work: the wheels' download alone (curl, 4 at a
#      time), uv installing them into a venv on the host (empty uv cache), inflating them alone
#      (unzip -p, 2 at a time), and the engine loading the finished image from a `docker save`
# Prints a table of seconds and ratios; the raw log goes beside it.
# usage: benches/stack.sh OUT.txt [WORKDIR]   (release build, uv, docker, buildah, skopeo,
#        docker-registry, curl, unzip)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "$1")
work=$(realpath -m "${2:-$root/target/bench-stack}")
bin=$root/target/release/gpubake
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 3; }
for tool in uv docker buildah skopeo docker-registry curl unzip bc; do
  command -v "$tool" >/dev/null || { echo "benches/stack.sh: $tool is not installed" >&2; exit 3; }
done
mkdir -p "$work"
cd "$work"
log=$out.log
: >"$log"
[ -f base/index.json ] || "$root/scripts/make-debian-base" ./base >/dev/null
cp "$root/examples/debian-pytorch2.9.yaml" r.yaml
sed 's/^  - tqdm==4.67.1$/  - tqdm==4.67.1\n  - six==1.17.0/' r.yaml >r6.yaml
sed -i 's/^name: debian-train$/name: debian-train-six/' r6.yaml
export GPUBAKE_CACHE_DIR=$work/cache
"$bin" resolve r.yaml -o r.lock >>"$log" 2>&1
"$bin" resolve r6.yaml -o r6.lock >>"$log" 2>&1

# The peer's context: uv (the host's binary) and the host's CA bundle, which containers need
# to reach PyPI here; the extras in a RUN of their own, as a team would write it.
mkdir -p peer peer6
# uv's own binary, not a version manager's shim script (UV_BIN overrides).
uv_bin=${UV_BIN:-$(pyenv which uv 2>/dev/null || command -v uv)}
for d in peer peer6; do
  cp "$(readlink -f "$uv_bin")" "$d/uv"
  cp /etc/ssl/certs/ca-certificates.crt "$d/ca.crt"
done
dockerfile() {  # BASE EXTRAS
  cat <<EOF
FROM $1
COPY uv /usr/local/bin/uv
COPY ca.crt /etc/ssl/certs/bench-ca.crt
ENV SSL_CERT_FILE=/etc/ssl/certs/bench-ca.crt UV_NATIVE_TLS=1 VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN uv venv --python /usr/bin/python3.11 /opt/venv && uv pip install --no-cache torch==2.9.1
RUN uv pip install --no-cache $2
EOF
}
dockerfile gpubake-bench-base:bookworm "numpy==2.3.4 tqdm==4.67.1" >peer/Dockerfile
dockerfile gpubake-bench-base:bookworm "numpy==2.3.4 tqdm==4.67.1 six==1.17.0" >peer6/Dockerfile
dockerfile localhost/gpubake-bench-base:bookworm "numpy==2.3.4 tqdm==4.67.1" >peer/Dockerfile.buildah

# Seconds a command takes; its output goes to the log, a failure ends the run.
t() {
  local name=$1 s e
  shift
  echo "== $name: $*" >>"$log"
  s=$(date +%s.%N)
  "$@" >>"$log" 2>&1 || { echo "benches/stack.sh: $name failed (see $log)" >&2; tail -20 "$log" >&2; exit 1; }
  e=$(date +%s.%N)
  printf '%.1f' "$(echo "$e - $s" | bc)"
}
ratio() { printf '%.2f' "$(echo "$1 / $2" | bc -l)"; }
clean_engine() {
  docker rmi -f gp-bench:v1 gp-bench:six peer:v1 peer:six "$reg/peer:v1" >/dev/null 2>&1 || true
  docker builder prune -af >/dev/null 2>&1 || true
  docker image prune -f >/dev/null 2>&1 || true
}
clean_buildah() {
  buildah rm -a >/dev/null 2>&1 || true
  buildah rmi -f localhost/peer:v1 >/dev/null 2>&1 || true
}
registry_pid=
start_registry() {
  if [ -n "$registry_pid" ]; then kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; fi
  rm -rf "$work/registry"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  reg=127.0.0.1:$port
  cat >"$work/registry.yml" <<EOF
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $work/registry}}
http: {addr: $reg, secret: bench}
EOF
  docker-registry serve "$work/registry.yml" >>"$log" 2>&1 &
  registry_pid=$!
  for _ in $(seq 50); do curl -sf "http://$reg/v2/" >/dev/null && return; sleep 0.1; done
  echo "benches/stack.sh: the registry did not start" >&2; exit 1
}
trap '[ -n "$registry_pid" ] && kill "$registry_pid" 2>/dev/null; rm -rf "$work/registry"' EXIT
start_registry

docker image inspect gpubake-bench-base:bookworm >/dev/null 2>&1 ||
  skopeo copy --quiet oci:./base:bookworm docker-daemon:gpubake-bench-base:bookworm
buildah images -q localhost/gpubake-bench-base:bookworm >/dev/null 2>&1 ||
  skopeo copy --quiet oci:./base:bookworm containers-storage:localhost/gpubake-bench-base:bookworm
{
  echo "# benches/stack.sh; commit $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo +changes); $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; $(date -u +%FT%TZ)"
  echo "# docker $(docker version --format '{{.Server.Version}}') ($(docker info --format '{{.Driver}}' 2>/dev/null) storage), $(buildah --version), $(uv --version)"
} | tee "$out" >>"$log"

# 1: cold into the engine.
clean_engine
rm -rf cache
g_cold=$(t "gpubake cold to the engine" "$bin" build r.yaml --from oci:./base:bookworm --to docker-daemon:gp-bench:v1 --timings)
d_cold=$(t "docker build cold" docker build -q -t peer:v1 peer)

# 2: one more package into the engine.
g_six=$(t "gpubake six to the engine" "$bin" build r6.yaml --from oci:./base:bookworm --to docker-daemon:gp-bench:six --timings)
d_six=$(t "docker build six" docker build -q -t peer:six peer6)

# The engine loading the finished image, from a file, as the floor of any way in.
docker save peer:v1 -o "$work/saved.tar"
clean_engine
sync
load=$(t "docker load of the saved image" docker load -q -i "$work/saved.tar")
rm -f "$work/saved.tar"

# 3: cold into a loopback registry.
clean_engine
rm -rf cache
start_registry
g_reg=$(t "gpubake cold to the registry" "$bin" build r.yaml --from oci:./base:bookworm --to "docker://$reg/gp:v1" --timings)
start_registry
d_build=$(t "docker build cold (for the push)" docker build -q -t "$reg/peer:v1" peer)
d_push=$(t "docker push" docker push -q "$reg/peer:v1")
clean_engine
start_registry
clean_buildah
b_build=$(t "buildah bud cold" buildah bud --isolation chroot -q -f peer/Dockerfile.buildah -t localhost/peer:v1 peer)
b_push=$(t "buildah push" buildah push --tls-verify=false -q localhost/peer:v1 "docker://$reg/peer-buildah:v1")
clean_buildah

# 4: a fresh layout, from the cache row 3 filled; then with the wheels alone.
rm -rf fresh fresh2
g_fresh=$(t "gpubake fresh layout, layers cached" "$bin" build r.yaml --from oci:./base:bookworm --to oci:./fresh:v1 --timings)
rm -rf cache/layout fresh
g_fresh_wheels=$(t "gpubake fresh layout, wheels only" "$bin" build r.yaml --from oci:./base:bookworm --to oci:./fresh2:v1 --timings)
size=$(du -sb fresh2/blobs | cut -f1)
rm -rf fresh2

# 5: the floors.
python3 - pylock.debian-train.toml >urls.txt <<'EOF'
import sys, tomllib
for p in tomllib.load(open(sys.argv[1], "rb"))["packages"]:
    for w in p.get("wheels", []):
        print(w["url"])
EOF
f_dl=$(t "download alone" sh -c 'xargs -P4 -n1 curl -sfL -o /dev/null <urls.txt')
rm -rf uvcache floorvenv
f_uv=$(t "uv install on the host" sh -c "uv venv -q --python /usr/bin/python3 floorvenv && UV_CACHE_DIR=$work/uvcache VIRTUAL_ENV=$work/floorvenv uv pip install -q torch==2.9.1 numpy==2.3.4 tqdm==4.67.1")
rm -rf uvcache floorvenv
f_inflate=$(t "inflate alone" sh -c "find cache/wheels -type f -size +1k ! -name '*.*' | xargs -P2 -n1 sh -c 'unzip -p \"\$0\" >/dev/null'")

{
  printf '%-58s %9s %9s %7s\n' "row" gpubake peer ratio
  printf '%-58s %9s %9s %7s\n' "1. cold, into the engine (peer: docker build + uv)" "$g_cold" "$d_cold" "$(ratio "$g_cold" "$d_cold")"
  printf '%-58s %9s %9s %7s\n' "2. one more pip package, into the engine (docker build)" "$g_six" "$d_six" "$(ratio "$g_six" "$d_six")"
  d_all=$(echo "$d_build + $d_push" | bc)
  b_all=$(echo "$b_build + $b_push" | bc)
  printf '%-58s %9s %9s %7s\n' "3. cold, into a loopback registry (docker build + push)" "$g_reg" "$d_all" "$(ratio "$g_reg" "$d_all")"
  printf '%-58s %9s %9s %7s\n' "   (docker build $d_build + docker push $d_push)" "" "" ""
  printf '%-58s %9s %9s %7s\n' "3b. the same against buildah bud + buildah push" "$g_reg" "$b_all" "$(ratio "$g_reg" "$b_all")"
  printf '%-58s %9s %9s %7s\n' "   (buildah bud $b_build + buildah push $b_push)" "" "" ""
  printf '%-58s %9s %9s %7s\n' "4. fresh OCI layout, wheels and layers cached" "$g_fresh" "" ""
  printf '%-58s %9s %9s %7s\n' "4b. fresh OCI layout, wheels cached, no layer" "$g_fresh_wheels" "" ""
  echo "floors, same machine and run:"
  printf '%-58s %9s\n' "  the wheels' download alone (curl, 4 at a time)" "$f_dl"
  printf '%-58s %9s\n' "  uv install into a host venv, empty uv cache" "$f_uv"
  printf '%-58s %9s\n' "  inflating the cached wheels alone (unzip -p, 2 at a time)" "$f_inflate"
  printf '%-58s %9s\n' "  docker load of the finished image from docker save" "$load"
  echo "gpubake layout: $((size / 1000000)) MB compressed"
} | tee -a "$out"
echo "log: $log" >&2
