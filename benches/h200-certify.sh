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

# The CDI spec: every /dev/nvidiaN as a device and in `all`; the control nodes and the
# driver's libraries (each soname link in the driver's directory, mounted at its soname in
# the image's library path) as edits common to every device.
spec_dir=$out/cdi
mkdir -p "$spec_dir"
driver_dir=${DRIVER_DIR:-/usr/local/nvidia/lib64}
nvidia_site=$(nvidia_site)
python3 - "$spec_dir/nvidia.yaml" "$driver_dir" "$nvidia_site" <<'PY'
import glob, json, os, re, sys
spec_file, driver_dir, nvidia_site = sys.argv[1:]
gpus = sorted(glob.glob("/dev/nvidia[0-9]*"), key=lambda p: int(re.sub(r"\D", "", p)))
node = lambda p: {"path": p}
mounts = []
lib_dir = "/usr/lib/x86_64-linux-gnu"
for link in sorted(glob.glob(driver_dir + "/lib*.so.*")):
    if not os.path.islink(link):
        continue
    name = os.path.basename(link)
    real = os.path.realpath(link)
    # sonames only (libcuda.so.1, libnvidia-ml.so.1): the link's name ends in one number.
    if re.search(r"\.so\.\d+$", name) and os.path.exists(real):
        mounts.append({"hostPath": real, "containerPath": f"{lib_dir}/{name}",
                       "options": ["ro", "nosuid", "nodev", "bind"]})
# NVRTC for the bundled kernel, from the CUDA toolkit (an image with the CUDA wheels has it).
for lib in sorted(glob.glob("/usr/local/cuda/lib64/libnvrtc*.so.*")):
    if not os.path.islink(lib):
        continue
    mounts.append({"hostPath": os.path.realpath(lib), "containerPath": f"{lib_dir}/{os.path.basename(lib)}",
                   "options": ["ro", "nosuid", "nodev", "bind"]})
if nvidia_site:
    py = re.search(r"python3\.\d+", nvidia_site).group(0)
    mounts.append({"hostPath": nvidia_site,
                   "containerPath": f"/opt/gpubake/venv/lib/{py}/site-packages/nvidia",
                   "options": ["ro", "nosuid", "nodev", "rbind"]})
control = [p for p in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] if os.path.exists(p)]
spec = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [{"name": str(i), "containerEdits": {"deviceNodes": [node(g)]}} for i, g in enumerate(gpus)]
             + [{"name": "all", "containerEdits": {"deviceNodes": [node(g) for g in gpus]}}],
    "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                       "deviceNodes": [node(p) for p in control],
                       "mounts": mounts},
}
open(spec_file, "w").write(json.dumps(spec, indent=1))
print(f"CDI spec: {len(gpus)} GPUs, {len(control)} control nodes, {len(mounts)} mounts")
PY

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
