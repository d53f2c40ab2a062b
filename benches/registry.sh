#!/usr/bin/env bash
# Pushes and pulls one image of about 2 GiB (a busybox base plus 2 GiB of incompressible
# data) with `gpubake copy` and with `skopeo copy`, in the same run, against a registry of its
# own: Debian's docker-registry on 127.0.0.1 with an htpasswd login and a self-signed
# certificate, as tests/registry.rs runs it. Each tool pushes to a repository of its own (so
# neither finds the other's blobs) and pulls into a new OCI layout; each round starts with an
# empty registry, and the rounds alternate which tool goes first. Prints a table; the raw timings go to OUT.
# Then the CI gate on the same image: certified once (`certify --gpus none --attach`), it is
# checked with `verify --certified --key` (manifest, config, certificate: no layer is
# downloaded) and with `--blobs` added (every blob downloaded and re-hashed as well).
# usage: benches/registry.sh GPUBAKE OUT [ROUNDS] [MIB]
set -euo pipefail
gpubake=$(realpath "$1")
out=$2
rounds=${3:-2}
mib=${4:-2048}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
registry_pid=
cleanup() {
  # The rounds run in a subshell (piped to tee): the registry's pid comes from its file.
  [ -f "$work/registry.pid" ] && kill "$(cat "$work/registry.pid")" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
host=127.0.0.1:$port
mkdir -p "$work/certs" "$work/auth"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
  -addext "subjectAltName=IP:127.0.0.1" -addext "basicConstraints=critical,CA:FALSE" \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
cp "$work/cert.pem" "$work/certs/ca.crt"
htpasswd -nbB bench bench-pass > "$work/htpasswd"
printf '{"auths":{"%s":{"auth":"%s"}}}' "$host" "$(printf bench:bench-pass | base64)" \
  > "$work/auth/config.json"
cat > "$work/config.yml" <<EOF
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $work/data}}
http: {addr: $host, secret: bench, tls: {certificate: $work/cert.pem, key: $work/key.pem}}
auth: {htpasswd: {realm: bench, path: $work/htpasswd}}
EOF
# Each round gets an empty registry: skopeo remembers where it pushed blobs before (its blob
# info cache) and would mount them instead of uploading.
serve() {
  [ -n "$registry_pid" ] && { kill "$registry_pid"; wait "$registry_pid" 2>/dev/null || true; }
  rm -rf "$work/data"
  docker-registry serve "$work/config.yml" >>"$work/registry.log" 2>&1 &
  registry_pid=$!
  echo "$registry_pid" > "$work/registry.pid"
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return; sleep 0.1; done
  echo "the registry did not start; see $work/registry.log" >&2
  exit 1
}

"$repo/scripts/make-test-base" "$work/base" "$gpubake" >/dev/null
mkdir -p "$work/ctx/big"
head -c "$((mib << 20))" /dev/urandom > "$work/ctx/big/noise.bin"
printf 'name: bench\nbase: ubuntu:24.04\npytorch: "2.9"\nfiles:\n  - {src: big, dest: /data}\n' \
  > "$work/ctx/recipe.yaml"
"$gpubake" build --without-python "$work/ctx/recipe.yaml" --from "oci:$work/base:latest" \
  --to "oci:$work/image:v1" >/dev/null 2>&1
rm -rf "$work/ctx"
bytes=$(du -sb "$work/image/blobs" | cut -f1)

export DOCKER_CONFIG=$work/auth
run() { # TOOL OP ROUND: one timed copy
  local tool=$1 op=$2 round=$3 src dst start end
  if [ "$op" = push ]; then
    src="oci:$work/image:v1"; dst="docker://$host/bench/$tool-$round:v1"
  else
    src="docker://$host/bench/$tool-$round:v1"; dst="oci:$work/pull-$tool-$round:v1"
  fi
  start=$(date +%s.%N)
  if [ "$tool" = gpubake ]; then
    "$gpubake" copy "$src" "$dst" --cert-dir "$work/certs" >/dev/null 2>&1
  else
    skopeo copy --quiet --src-cert-dir "$work/certs" --dest-cert-dir "$work/certs" \
      --src-creds bench:bench-pass --dest-creds bench:bench-pass "$src" "$dst" >/dev/null
  fi
  end=$(date +%s.%N)
  echo "$tool $op $round $(echo "$end - $start" | bc)"
  rm -rf "$work/pull-$tool-$round"
}

{
  echo "# benches/registry.sh: $(date -u +%FT%TZ), $(nproc) cores, $(uname -r)"
  echo "# gpubake $("$gpubake" --version | cut -d' ' -f2) ($(git -C "$repo" rev-parse --short HEAD)), $(skopeo --version)"
  echo "# $(docker-registry --version 2>&1 | head -1); image: $bytes bytes of blobs"
  echo "# tool op round seconds"
  for round in $(seq "$rounds"); do
    serve
    if [ $((round % 2)) -eq 1 ]; then order="gpubake skopeo"; else order="skopeo gpubake"; fi
    for op in push pull; do
      for tool in $order; do run "$tool" "$op" "$round"; done
    done
  done
  # The gate, on the image as gpubake pushed it in the last round.
  target="docker://$host/bench/gpubake-$rounds:v1"
  GPUBAKE_KEY_PASSPHRASE= "$gpubake" key generate --output-prefix "$work/gate" >/dev/null 2>&1
  GPUBAKE_KEY_PASSPHRASE= "$gpubake" certify "$target" --gpus none --attach --key "$work/gate.key" \
    --cert-dir "$work/certs" >/dev/null 2>&1
  for step in gate gate+blobs; do
    extra=(); [ "$step" = gate+blobs ] && extra=(--blobs)
    start=$(date +%s.%N)
    rc=0
    "$gpubake" verify "$target" --certified --static-ok --key "$work/gate.pub" "${extra[@]}" \
      --cert-dir "$work/certs" >/dev/null 2>&1 || rc=$?
    end=$(date +%s.%N)
    echo "gpubake $step 1 $(echo "$end - $start" | bc) exit $rc"
  done
} | tee "$out" >/dev/null

awk -v bytes="$bytes" '
  /^#/ { print; next }
  { t[$1" "$2] += $4; n[$1" "$2]++ }
  END {
    printf "%-6s %12s %12s %12s %14s\n", "op", "gpubake s", "skopeo s", "ratio", "gpubake MB/s"
    for (i = 1; i <= 2; i++) {
      op = (i == 1) ? "push" : "pull"
      g = t["gpubake " op] / n["gpubake " op]; s = t["skopeo " op] / n["skopeo " op]
      printf "%-6s %12.2f %12.2f %11.2fx %14.1f\n", op, g, s, g / s, bytes / g / 1e6
    }
    printf "verify --certified --key (the gate): %.2f s; with --blobs: %.2f s\n", \
      t["gpubake gate"], t["gpubake gate+blobs"]
  }' "$out"
