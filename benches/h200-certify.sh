#!/usr/bin/env bash
# `gpubake certify --runtime crun` on a GPU machine that has no container engine and no
# nvidia-container-toolkit: Debian's crun is unpacked into a private prefix, and a CDI spec is
# written for the devices and driver libraries this machine has, the way `nvidia-ctk cdi
# generate` describes a node (device nodes, driver libraries mounted at their sonames). The
# machine's own NCCL, from its torch environment, is mounted at the image's environment path,
# since the full torch image is too large to carry. Writes the certificate (text, JSON, JUnit),
# the spec, and a run with an impossible policy floor, under OUTDIR.
# usage: benches/h200-certify.sh BINARY IMAGE DEBS_DIR OUTDIR
# env:   IMPOSSIBLE=0   leave out the run with an impossible policy
set -uo pipefail
bin=$(realpath "$1")
image=$2
debs=$3
out=$(realpath -m "$4")
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/lib.sh"

# crun from Debian's packages, private to this run.
for deb in "$debs"/*.deb; do dpkg -x "$deb" "$work/crun"; done
export PATH=$work/crun/usr/bin:$PATH
export LD_LIBRARY_PATH=$work/crun/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
crun --version | head -1

# The CDI spec this machine lacks (benches/lib.sh).
spec_dir=$out/cdi
mkdir -p "$spec_dir"
write_cdi_spec "$spec_dir/nvidia.yaml" "${DRIVER_DIR:-/usr/local/nvidia/lib64}"

certify() {
  local name=$1; shift
  local start=$SECONDS
  "$bin" certify "$image" --runtime crun --cdi-spec-dir "$spec_dir" \
    --out "$out/$name.json" --junit "$out/$name.xml" "$@" >"$out/$name.txt" 2>&1
  local status=$?
  echo "$name: exit $status in $((SECONDS - start)) s"
  tail -4 "$out/$name.txt"
}
certify certify-crun
[ "${IMPOSSIBLE:-1}" = 0 ] && exit 0
# A floor no GPU meets must fail certification: the policy reaches the probe in the container.
cat >"$work/impossible.yaml" <<'YAML'
- match: "H200"
  model: H200 (impossible floors)
  gpus: [h200]
  link: nvlink
  pcie: {gen: 5, width: 16}
  nvlink_links: 18
  memory_gbps_floor: 1000000
  p2p_gbps_floor: 1000000
YAML
certify certify-crun-impossible-policy --policy "$work/impossible.yaml" --quick
