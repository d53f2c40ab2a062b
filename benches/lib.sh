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
