# Sourced by the GPU bench scripts (benches/h200*.sh, nccl-truth.sh): what each of them needs
# from the machine's CUDA image, found one way.
#
# Never NVLink multicast: these machines' GPUs are shared with others, and a program that
# uses it can put them out of service. Every program a script starts inherits this.
export NCCL_NVLS_ENABLE=0

# The machine's torch environment's `nvidia` package directory (NCCL, cuDNN, ... wheels), or
# nothing.
nvidia_site() {
  ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia 2>/dev/null | head -1
}

# write_cdi_spec FILE DRIVER_DIR: a CDI spec for this machine, which has no toolkit to write
# one, the way `nvidia-ctk cdi generate` describes a node: every /dev/nvidiaN as a device and
# in `all`; the control nodes and the driver's libraries (each soname link in DRIVER_DIR,
# mounted at its soname in the image's library path) as edits common to every device; NVRTC
# and the torch environment's `nvidia` packages for the probe's kernel and NCCL.
write_cdi_spec() {
  local nvidia_site
  nvidia_site=$(nvidia_site)
  python3 - "$1" "$2" "$nvidia_site" <<'PY'
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
}

# lib_shim DIR: DIR gets libnccl.so and libnvrtc.so, links to torch's NCCL and the CUDA
# toolkit's NVRTC, since the probe's worker opens them by their plain names as `gpubake
# probe` arranges it; SHIM_PATH is then the LD_LIBRARY_PATH that finds them.
lib_shim() {
  local dir=$1 site nccl nvrtc
  mkdir -p "$dir"
  site=$(nvidia_site)
  nccl=$(ls "${site:-/nonexistent}"/nccl/lib/libnccl.so.2 2>/dev/null | head -1)
  nvrtc=$(ls /usr/local/cuda/lib64/libnvrtc.so.* 2>/dev/null | grep -v builtins | head -1)
  [ -n "$nccl" ] && ln -sf "$nccl" "$dir/libnccl.so"
  [ -n "$nvrtc" ] && ln -sf "$nvrtc" "$dir/libnvrtc.so"
  SHIM_PATH="$dir:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
}

# world_checks FILE: the `world` checks of a `probe --world --json` verdict, one a line.
world_checks() {
  python3 - "$1" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no verdict:", e); sys.exit()
for c in d["checks"]:
    if c["phase"] == "world":
        print(f"  {c['status']:4}  {c['name']}: {c['detail']}")
PY
}
