#!/usr/bin/env bash
# What the dynamic loader really does for a training process, recorded so that the static
# link closure (src/image/links.rs) can be held to it without the machine:
#   1. the machine's torch initialises CUDA, runs a bf16 GEMM, a cuDNN convolution and a
#      one-rank NCCL all-reduce under LD_DEBUG=files,libs (ld.so's own account of every
#      object it loads, who asked for it, needed or dlopened, and every path it tried), then
#      lists every file mapped into it (/proc/self/maps);
#   2. a second process (no LD_DEBUG) records the file tree the loader searched: every
#      directory ld.so tried a file in, the venv, the driver's and the CUDA toolkit's library
#      directories, the system directories and every directory /etc/ld.so.cache names, each
#      entry as a symbolic link (its target), a directory, or a file with what readelf says of
#      it (class, machine, interpreter, DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH, DT_FLAGS_1);
#      and /etc/ld.so.cache itself.
# Writes OUT.json.gz. Changes nothing on the host.
# usage: benches/h200-closure.sh OUT.json.gz [PYTHON]
set -uo pipefail
. "$(dirname "$0")/lib.sh"
out=$(realpath -m "$1")
python=${2:-$(ls /opt/*/.venv/bin/python3 2>/dev/null | head -1)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "workload under LD_DEBUG ($python)"
MASTER_ADDR=127.0.0.1 MASTER_PORT=29534 LD_DEBUG=files,libs LD_DEBUG_OUTPUT="$work/ld" \
  timeout -k 5 ${WORKLOAD_TIMEOUT:-150} "$python" - "$work/process.json" <<'PY'
import json, os, sys, time
import torch, torch.distributed as dist
t0 = time.time()
print("  torch imported", flush=True)
torch.cuda.init()
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
c = a @ a
conv = torch.nn.functional.conv2d(torch.randn(8, 64, 56, 56, device="cuda"),
                                  torch.randn(64, 64, 3, 3, device="cuda"))
torch.cuda.synchronize()
print("  GEMM and convolution ran", flush=True)
dist.init_process_group("nccl", rank=0, world_size=1)
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
mapped = sorted({l.split(maxsplit=5)[5].strip() for l in open("/proc/self/maps")
                 if len(l.split(maxsplit=5)) == 6 and l.split(maxsplit=5)[5].startswith("/")})
json.dump({"pid": os.getpid(), "executable": sys.executable,
           "real_executable": os.path.realpath("/proc/self/exe"),
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())),
           "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH"),
           "seconds": round(time.time() - t0, 1), "maps": mapped},
          open(sys.argv[1], "w"), indent=1)
dist.destroy_process_group()
PY
echo "workload: exit $? in $SECONDS s; $(ls "$work" | wc -l) files"

echo "recording the tree"
timeout -k 5 ${RECORD_TIMEOUT:-150} "$python" - "$work" "$out" <<'PY'
import base64, glob, gzip, json, os, re, stat, subprocess, sys, time
started = time.time()
work, out = sys.argv[1:]
proc = json.load(open(os.path.join(work, "process.json")))
debug_file = os.path.join(work, f"ld.{proc['pid']}")
debug = open(debug_file, errors="replace").read() if os.path.exists(debug_file) else ""

# Directories to record: where ld.so tried files, and where it could have.
dirs, trees = set(), set()
for m in re.finditer(r"trying file=(\S+)", debug):
    dirs.add(os.path.dirname(m.group(1)))
for m in re.finditer(r"search path=(\S+)", debug):
    for d in m.group(1).split(":"):
        if d:
            dirs.add(d.rstrip("/"))
for p in proc["maps"]:
    dirs.add(os.path.dirname(p))
for d in (proc.get("LD_LIBRARY_PATH") or "").split(":"):
    if d:
        dirs.add(d)
cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
for m in re.finditer(r"=> (\S+)", cache):
    dirs.add(os.path.dirname(m.group(1)))
dirs |= {"/lib", "/usr/lib", "/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu",
         "/usr/lib/x86_64-linux-gnu", "/usr/local/lib", os.path.dirname(proc["executable"])}
site = next(iter(glob.glob(os.path.join(os.path.dirname(os.path.dirname(proc["executable"])),
                                        "lib/python3*/site-packages"))), None)
if site:
    trees.add(site)
for d in glob.glob("/usr/local/nvidia") + glob.glob("/usr/local/cuda*/targets/*/lib"):
    trees.add(d)

entries = {}
def note(path):
    """Records `path` and every symbolic link on the way to it."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        p = "/" + "/".join(parts[:i])
        if p in entries:
            continue
        try:
            st = os.lstat(p)
        except OSError:
            entries[p] = {"kind": "absent"}
            return
        if os.path.islink(p):
            entries[p] = {"kind": "link", "target": os.readlink(p)}
            target = os.path.join(os.path.dirname(p), os.readlink(p))
            note(os.path.normpath(target))
        elif os.path.isdir(p):
            entries[p] = {"kind": "dir"}
        elif stat.S_ISREG(st.st_mode):
            entries[p] = {"kind": "file", "size": st.st_size}
        else:
            entries[p] = {"kind": "special"}
def list_dir(d, recurse):
    note(d)
    real = os.path.realpath(d)
    if real != d:
        note(real)
    try:
        names = sorted(os.listdir(real))
    except OSError:
        return
    if entries.get(real, {}).get("kind") == "dir":
        # Every directory, link and file with ".so" in its name is recorded: a library
        # name not recorded here is absent.
        entries[real]["listed"] = True
    for n in names:
        p = os.path.join(real, n)
        if ".so" not in n and os.path.isfile(p) and not os.path.islink(p):
            continue
        note(p)
        if recurse and os.path.isdir(p) and not os.path.islink(p):
            list_dir(p, True)
for d in sorted(dirs):
    list_dir(d, False)
print(f"  {len(dirs)} directories listed, {len(entries)} paths ({time.time() - started:.0f} s)", flush=True)
for d in sorted(trees):
    list_dir(d, True)
print(f"  {len(trees)} trees listed, {len(entries)} paths ({time.time() - started:.0f} s)", flush=True)
for p in proc["maps"] + [proc["executable"], proc["real_executable"]]:
    note(p)

# readelf on every regular file that starts with the ELF magic, 100 at a time.
elves = []
for p, e in entries.items():
    if e["kind"] == "file":
        try:
            with open(p, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    elves.append(p)
        except OSError:
            pass
keep = re.compile(r"Class:|Machine:|Requesting program interpreter|\((NEEDED|SONAME|RPATH|RUNPATH|FLAGS_1)\)")
for i in range(0, len(elves), 100):
    batch = elves[i:i + 100]
    text = subprocess.run(["readelf", "-h", "-l", "-d", "-W"] + batch, capture_output=True,
                          text=True, errors="replace", timeout=60).stdout
    current = batch[0] if len(batch) == 1 else None
    for line in text.splitlines():
        m = re.match(r"^File: (.+)$", line)
        if m:
            current = m.group(1)
            continue
        if current and keep.search(line):
            entries[current].setdefault("readelf", []).append(line.strip())

def machine():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip()
    except OSError as e:
        return f"nvidia-smi: {e}"
record = {
    "machine": machine(),
    "process": proc,
    "ld_debug": debug,
    "ld_so_cache": base64.b64encode(open("/etc/ld.so.cache", "rb").read()).decode(),
    "ld_so_conf_d": {f: open(f).read() for f in sorted(glob.glob("/etc/ld.so.conf.d/*.conf"))},
    "entries": entries,
}
with gzip.open(out, "wt") as f:
    json.dump(record, f)
print(f"closure record: {len(proc['maps'])} mapped files, {len(entries)} paths, "
      f"{len(elves)} ELF files, {len(debug.splitlines())} LD_DEBUG lines -> {out}")
PY
