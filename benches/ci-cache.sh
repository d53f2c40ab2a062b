#!/usr/bin/env bash
# A fresh CI runner against a registry that holds the README's image and its layer cache:
# examples/debian-pytorch2.9.yaml (PyTorch 2.9.1 with its CUDA 12.8 wheels, NumPy, tqdm: 27
# wheels, 4.1 GB) on the Debian base scripts/make-debian-base makes, in a loopback registry
# (Debian's docker-registry, plain HTTP on 127.0.0.1), against the engine's own way to reuse
# a registry image's layers on a runner that starts empty: `docker pull` of the last image,
# `docker build --cache-from` it (the legacy builder; a two-step Dockerfile, `uv venv` +
# `uv pip install torch==2.9.1` in one RUN, the extras in a second, the NCCL settings copied
# last) and `docker push`.
# Rows, each from the image of the README's recipe under the destination tag and the cache
# as its build recorded it (gpubake) or that image (the peer):
#   1. the same recipe again
#   2. one more pip package (six==1.17.0)
#   3. a preset value changed (NCCL_DEBUG=WARN over the presets)
# A gpubake measurement starts from an empty GPUBAKE_CACHE_DIR and runs
#   build RECIPE --from docker://REG/base --to docker://REG/train:ROW
#     --cache-from docker://REG/train-cache:main --cache-to docker://REG/train-cache:main
# (the closure beside the recipe, as a repository that commits its lock holds it); a peer
# measurement starts from an engine without the bench's images or build cache. Pair by pair:
# each repetition runs every row for both, the order alternating. Prints one line per
# measurement and a table of medians; the raw log goes beside OUT.
# usage: benches/ci-cache.sh OUT.txt [REPS [WORKDIR]]   (release build, uv, docker,
#        docker-registry, curl, bc)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "$1")
reps=${2:-3}
work=$(realpath -m "${3:-$root/target/bench-ci-cache}")
bin=$root/target/release/gpubake
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 3; }
for tool in uv docker docker-registry curl bc; do
  command -v "$tool" >/dev/null || { echo "benches/ci-cache.sh: $tool is not installed" >&2; exit 3; }
done
mkdir -p "$work"
cd "$work"
log=$out.log
: >"$log"
say() { echo "ci-cache.sh: $*" >&2; }

# --- the registry ------------------------------------------------------------------------
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
reg=127.0.0.1:$port
rm -rf registry
cat >registry.yml <<EOF
version: 0.1
log: {level: error, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $work/registry}}
http: {addr: $reg, secret: bench}
EOF
docker-registry serve registry.yml >>"$log" 2>&1 &
registry_pid=$!
trap 'kill $registry_pid 2>/dev/null; rm -rf "$work/registry"' EXIT
for _ in $(seq 50); do curl -sf "http://$reg/v2/" >/dev/null && break; sleep 0.1; done

# Points TAG2 of REPO at the manifest TAG1 names (the blobs are the repository's already).
retag() {
  local repo=$1 from=$2 to=$3 type
  type=$(curl -sfI -H "Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json" \
    "http://$reg/v2/$repo/manifests/$from" | tr -d '\r' | awk -F': ' 'tolower($1)=="content-type"{print $2}')
  curl -sf -H "Accept: $type" "http://$reg/v2/$repo/manifests/$from" -o manifest.json
  curl -sf -X PUT -H "Content-Type: $type" --data-binary @manifest.json \
    "http://$reg/v2/$repo/manifests/$to" >/dev/null
}

# --- the recipes, their closures, the peer's contexts --------------------------------------
[ -f base/index.json ] || "$root/scripts/make-debian-base" ./base >/dev/null
export GPUBAKE_CACHE_DIR=$work/warm
cp "$root/examples/debian-pytorch2.9.yaml" r.yaml
sed 's/^  - tqdm==4.67.1$/  - tqdm==4.67.1\n  - six==1.17.0/' r.yaml >r6.yaml
sed -i 's/^name: debian-train$/name: debian-train-six/' r6.yaml
{ sed 's/^name: debian-train$/name: debian-train-debug/' r.yaml; printf 'env:\n  NCCL_DEBUG: WARN\n'; } >rp.yaml
for r in r r6 rp; do "$bin" resolve $r.yaml -o $r.lock >>"$log" 2>&1; done
uv_bin=${UV_BIN:-$(pyenv which uv 2>/dev/null || command -v uv)}
dockerfile() {  # EXTRAS
  cat <<EOF
FROM $reg/base:bookworm
COPY uv /usr/local/bin/uv
COPY ca.crt /etc/ssl/certs/bench-ca.crt
ENV SSL_CERT_FILE=/etc/ssl/certs/bench-ca.crt UV_NATIVE_TLS=1 VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN uv venv --python /usr/bin/python3.11 /opt/venv && uv pip install --no-cache torch==2.9.1
RUN uv pip install --no-cache $1
COPY nccl.conf /etc/nccl.conf
EOF
}
for d in peer peer6 peerp; do
  mkdir -p $d
  cp "$(readlink -f "$uv_bin")" $d/uv
  cp /etc/ssl/certs/ca-certificates.crt $d/ca.crt
  printf 'NCCL_P2P_LEVEL=NVL\n' >$d/nccl.conf
done
printf 'NCCL_DEBUG=WARN\n' >>peerp/nccl.conf
dockerfile "numpy==2.3.4 tqdm==4.67.1" >peer/Dockerfile
dockerfile "numpy==2.3.4 tqdm==4.67.1 six==1.17.0" >peer6/Dockerfile
dockerfile "numpy==2.3.4 tqdm==4.67.1" >peerp/Dockerfile

# --- the registry as CI left it: the image, its cache, the peer's image --------------------
say "seeding the registry (the base, gpubake's image and cache, the peer's image)"
"$bin" copy oci:./base:bookworm "docker://$reg/base:bookworm" >>"$log" 2>&1
"$bin" build r.yaml --from "docker://$reg/base:bookworm" --to "docker://$reg/train:v1" \
  --cache-to "docker://$reg/train-cache:main" >>"$log" 2>&1
# Every measurement starts from this cache: one that a row recorded would answer the next
# repetition of that row.
retag train-cache main seed
clean_engine() {
  docker images --format '{{.Repository}}:{{.Tag}}' | grep "^$reg/" | xargs -r docker rmi -f >/dev/null 2>&1 || true
  docker builder prune -af >/dev/null 2>&1 || true
  docker image prune -f >/dev/null 2>&1 || true
}
clean_engine
DOCKER_BUILDKIT=0 docker build -q -t "$reg/peer:v1" peer >>"$log" 2>&1
docker push -q "$reg/peer:v1" >>"$log" 2>&1
clean_engine
{
  echo "# benches/ci-cache.sh; commit $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo +changes); $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; $(date -u +%FT%TZ)"
  echo "# docker $(docker version --format '{{.Server.Version}}') ($(docker info --format '{{.Driver}}' 2>/dev/null) storage), docker-registry $(docker-registry --version 2>/dev/null | awk '{print $3}'), $(uv --version)"
  echo "# image: $(du -sb registry | cut -f1) bytes in the registry after seeding"
} | tee "$out" >>"$log"

# Seconds a command takes; its output goes to the log, a failure ends the run.
t() {
  local name=$1 s e
  shift
  echo "== $name: $*" >>"$log"
  s=$(date +%s.%N)
  "$@" >>"$log" 2>&1 || { say "$name failed (see $log)"; tail -20 "$log" >&2; exit 1; }
  e=$(date +%s.%N)
  printf '%.2f' "$(echo "$e - $s" | bc)"
}
declare -A recipe=([1]=r.yaml [2]=r6.yaml [3]=rp.yaml) context=([1]=peer [2]=peer6 [3]=peerp)
gpubake_row() {  # ROW
  retag train v1 "row$1"
  retag train-cache seed main
  rm -rf runner
  export GPUBAKE_CACHE_DIR=$work/runner
  t "gpubake row $1" "$bin" build "${recipe[$1]}" \
    --from "docker://$reg/base:bookworm" --to "docker://$reg/train:row$1" \
    --cache-from "docker://$reg/train-cache:main" --cache-to "docker://$reg/train-cache:main" --timings
}
peer_row() {  # ROW
  retag peer v1 "row$1"
  clean_engine
  sync
  t "peer row $1" sh -c "docker pull -q $reg/peer:row$1 &&
    DOCKER_BUILDKIT=0 docker build -q --cache-from $reg/peer:row$1 -t $reg/peer:row$1 ${context[$1]} &&
    docker push -q $reg/peer:row$1"
}
declare -A g p
for rep in $(seq "$reps"); do
  for row in 1 2 3; do
    if [ $(((rep + row) % 2)) = 0 ]; then
      gs=$(gpubake_row $row); ps=$(peer_row $row)
    else
      ps=$(peer_row $row); gs=$(gpubake_row $row)
    fi
    g[$row]="${g[$row]:-} $gs"
    p[$row]="${p[$row]:-} $ps"
    echo "rep $rep row $row: gpubake $gs s, peer $ps s" | tee -a "$out" >&2
  done
done
clean_engine

median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
{
  printf '%-32s %9s %9s %7s  %s\n' "row (median of $reps, seconds)" gpubake peer ratio goal
  names=([1]="same recipe again" [2]="one more pip package" [3]="a preset value changed")
  goals=([1]="<= 5 s" [2]="<= 10 s and <= 0.2x" [3]="<= 5 s")
  for row in 1 2 3; do
    gm=$(echo "${g[$row]}" | median)
    pm=$(echo "${p[$row]}" | median)
    printf '%-32s %9.2f %9.2f %7.3f  %s\n' "$row. ${names[$row]}" "$gm" "$pm" "$(echo "$gm / $pm" | bc -l)" "${goals[$row]}"
  done
} | tee -a "$out"
echo "log: $log" >&2
