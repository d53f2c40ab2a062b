#!/usr/bin/env bash
# What a training process on this machine really binds, as raw data for the static link
# closure to be held to: the machine's own torch initialises CUDA, runs a bf16 GEMM, a cuDNN
# convolution and a one-rank NCCL all-reduce, then prints every shared object mapped into it
# (/proc/self/maps), beside what the loader is told (LD_LIBRARY_PATH, /etc/ld.so.conf.d,
# `ldconfig -p`) and each nvidia wheel library's DT_NEEDED and RUNPATH. Changes nothing on
# the host.
# usage: benches/h200-maps.sh OUT.json [PYTHON]
set -uo pipefail
. "$(dirname "$0")/lib.sh"
out=$1
python=${2:-$(ls /opt/*/.venv/bin/python3 2>/dev/null | head -1)}
MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 timeout 300 "$python" - "$out" <<'PY'
import json, os, subprocess, sys, time
import torch, torch.distributed as dist
t0 = time.time()
torch.cuda.init()
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
start = torch.cuda.Event(enable_timing=True); end = torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20):
    c = a @ b
end.record(); torch.cuda.synchronize()
tflops = 20 * 2 * 8192**3 / (start.elapsed_time(end) / 1e3) / 1e12
conv = torch.nn.functional.conv2d(torch.randn(8, 64, 56, 56, device="cuda"), torch.randn(64, 64, 3, 3, device="cuda"))
torch.cuda.synchronize()
dist.init_process_group("nccl", rank=0, world_size=1)
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x); torch.cuda.synchronize()
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if ".so" in l.split()[-1]})
def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except Exception as e:
        return f"error: {e}"
site = os.path.dirname(os.path.dirname(torch.__file__))
dynamic = {}
for root, _, files in os.walk(os.path.join(site, "nvidia")):
    for f in files:
        if ".so" in f:
            p = os.path.join(root, f)
            dynamic[p] = {"size": os.path.getsize(p), "dynamic": run("readelf", "-d", p)}
for f in ("lib/libtorch_cuda.so", "lib/libtorch_python.so", "lib/libc10_cuda.so", "_C.cpython-312-x86_64-linux-gnu.so"):
    p = os.path.join(os.path.dirname(torch.__file__), f)
    if os.path.exists(p):
        dynamic[p] = {"size": os.path.getsize(p), "dynamic": run("readelf", "-d", p)}
confd = {}
for d in ("/etc/ld.so.conf.d",):
    for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        confd[f] = open(os.path.join(d, f)).read()
json.dump({
    "python": sys.executable, "torch": torch.__version__, "cuda": torch.version.cuda,
    "cudnn": torch.backends.cudnn.version(), "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    "arch_list": torch.cuda.get_arch_list(), "capability": list(torch.cuda.get_device_capability()),
    "gemm_bf16_tflops": round(tflops, 1), "seconds": round(time.time() - t0, 1),
    "maps": maps, "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH"),
    "ld_so_conf": open("/etc/ld.so.conf").read() if os.path.exists("/etc/ld.so.conf") else None,
    "ld_so_conf_d": confd, "ldconfig_p": run("ldconfig", "-p"), "dynamic": dynamic,
}, open(sys.argv[1], "w"), indent=1)
dist.destroy_process_group()
print(f"maps: {len(maps)} shared objects; bf16 GEMM {tflops:.0f} TFLOP/s")
PY
