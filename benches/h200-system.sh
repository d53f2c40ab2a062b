#!/usr/bin/env bash
# The OS layer on the GPU machine: preflight images (`build --without-python`) whose NCCL
# settings ask for the IB transport, one with the system packages NCCL's IB transport and a
# launcher need and one without them, certified under crun (benches/h200-certify.sh does the
# crun and CDI part). In each, the probe opens libibverbs.so.1 and libmlx5.so.1 as NCCL does,
# and NCCL's own log says whether it could open libibverbs; the machine has no RDMA device, so
# with the packages IB finds none and NCCL uses sockets. A third image sets the roce preset
# (NCCL_NET=IB) to record what NCCL does when IB is demanded on a node without a device.
#
# benches/h200-system-images.sh makes the images (one OCI layout, tags without, with, roce),
# the binary and the .debs.
# usage: benches/h200-system.sh BINARY.xz LAYOUT DEBS_DIR OUTDIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(realpath -m "$4")
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$here/lib.sh"

layout=$(realpath "$2")
python3 - "$1" "$work/gpubake" <<'PY'
import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod +x "$work/gpubake"
"$work/gpubake" --version

for image in without with roce; do
  echo "== $image"
  IMPOSSIBLE=0 timeout 300 "$here/h200-certify.sh" "$work/gpubake" \
    "oci:$layout:$image" "$3" "$out/$image"
  python3 - "$out/$image/certify-crun.json" <<'PY'
import json, sys
try:
    c = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no certificate:", e); sys.exit()
probe = c.get("facts", {}).get("probe", {})
for check in probe.get("checks", []):
    if check["name"] in ("libibverbs.so.1", "libmlx5.so.1", "IB transport", "NCCL run"):
        print(f"  {check['status']:4}  {check['name']}: {check['detail']}")
log = probe.get("facts", {}).get("nccl_effective", {}).get("log", {})
for line in log.get("ib", []):
    print(f"  NCCL said: {line}")
for line in log.get("warnings", []):
    print(f"  NCCL warned: {line}")
print("  verdict:", c.get("verdict"))
PY
done
