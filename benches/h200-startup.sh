#!/usr/bin/env bash
# What a training job's start-up reads, recorded on a GPU node: `gpubake probe
# --record-startup` on the machine's torch environment (import torch, CUDA init, a bf16 GEMM,
# a cuDNN convolution, a one-rank NCCL all-reduce), and again with no GPU visible (import
# alone, as a CPU-only builder would record it). The record is checked against the kernel:
# every file under site-packages is evicted from the page cache first, and afterwards each
# file's resident bytes (mincore, readahead included) are set beside what the record says
# the start-up touched. Timed with and without recording.
# usage: benches/h200-startup.sh BINARY OUTDIR
set -uo pipefail
bin=$1
out=$2
. "$(dirname "$0")/lib.sh"
mkdir -p "$out"
python=$(ls /opt/*/.venv/bin/python3 2>/dev/null | head -1)
site=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "python $python, site-packages $site"

# resident ACTION FILE: evict (every file under site-packages) or count (resident bytes of
# each, as JSON {path: bytes} for those with any).
resident() {
  "$python" - "$1" "$site" "$2" <<'PY'
import ctypes, json, mmap, os, sys
action, site, out = sys.argv[1:]
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
page = os.sysconf("SC_PAGE_SIZE")
found = {}
for d, _, names in os.walk(site):
    for n in names:
        p = os.path.join(d, n)
        if os.path.islink(p) or not os.path.isfile(p):
            continue
        size = os.path.getsize(p)
        if size == 0:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            if action == "evict":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                continue
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            libc.mincore(ctypes.c_void_p(addr), size, vec)
            libc.munmap(ctypes.c_void_p(addr), size)
            hit = sum(1 for v in vec if v & 1)
            if hit:
                found["site-packages/" + os.path.relpath(p, site)] = min(size, hit * page)
        finally:
            os.close(fd)
if action == "count":
    json.dump(found, open(out, "w"))
PY
}

sync
resident evict -
/usr/bin/time -f "  probe --record-startup (GPU): %e s" "$bin" probe --python "$python" \
  --record-startup "$out/startup-h200.json" >"$out/probe-record-h200.txt" 2>"$out/probe-record-h200.err"
echo "  exit $?"
resident count "$out/resident-h200.json"
grep -E "startup record|torch" "$out/probe-record-h200.txt"

resident evict -
CUDA_VISIBLE_DEVICES= /usr/bin/time -f "  probe --record-startup (no GPU visible): %e s" \
  "$bin" probe --python "$python" --record-startup "$out/startup-import-h200.json" \
  >"$out/probe-record-import-h200.txt" 2>"$out/probe-record-import-h200.err"
echo "  exit $?"
grep -E "startup record" "$out/probe-record-import-h200.txt"

resident evict -
/usr/bin/time -f "  probe, not recording (GPU): %e s" "$bin" probe --python "$python" \
  >"$out/probe-norecord-h200.txt" 2>&1
echo "  exit $?"

"$python" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rec = json.load(open(f"{out}/startup-h200.json"))
imp = json.load(open(f"{out}/startup-import-h200.json"))
res = json.load(open(f"{out}/resident-h200.json"))
mb = lambda n: f"{n / 1e6:,.0f} MB"
files = rec["files"]
read = sum(f["read"] for f in files)
size = sum(f["size"] for f in files)
print(f"GPU start-up ({', '.join(rec['steps'])}): {len(files)} files, {mb(read)} touched of {mb(size)}")
print(f"import alone: {len(imp['files'])} files, {mb(sum(f['read'] for f in imp['files']))} touched")
gpu = {f["path"] for f in files}
print(f"  of the import's files, {len(gpu & {f['path'] for f in imp['files']})} are in the GPU record")
under = [f for f in files if res.get(f["path"], 0) < min(f["read"], f["size"]) - 65536]
print(f"resident after the run: {len(res)} files, {mb(sum(res.values()))}")
print(f"  recorded files with fewer bytes resident than recorded as touched: {len(under)}")
for f in under[:10]:
    print(f"    {f['path']}: recorded {f['read']}, resident {res.get(f['path'], 0)}")
missed = sorted(((b, p) for p, b in res.items() if p not in gpu), reverse=True)
print(f"  resident but not recorded: {len(missed)} files, {mb(sum(b for b, _ in missed))}")
for b, p in missed[:15]:
    print(f"    {p}: {b}")
print("largest touched:")
for f in sorted(files, key=lambda f: -f["read"])[:12]:
    print(f"  {f['path']}: {mb(f['read'])} of {mb(f['size'])}, resident {mb(res.get(f['path'], 0))}")
PY
