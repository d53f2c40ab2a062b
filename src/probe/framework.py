# The training job's own path, as `gpubake probe` checks it: run with the image's interpreter
# and environment (standard library plus torch), one process per GPU as torchrun starts them
# (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Writes one JSON object to the
# file named by its first argument; what fails is recorded with its own words, never raised.
import json
import os
import re
import sys
import time
import traceback

out_path = sys.argv[1]
gemm_n = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
sizes = [int(s) for s in (sys.argv[3] if len(sys.argv) > 3 else "1048576,268435456").split(",")]
rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
local = int(os.environ.get("LOCAL_RANK", "0"))
result = {"rank": rank, "world_size": world, "python": sys.executable,
          "python_version": sys.version.split()[0]}


class StartupRecorder:
    """What the start-up reads under the interpreter's site-packages, in first-access order:
    the files Python opens (modules, their bytecode, data files), read whole, and the files
    the process maps (the shared libraries the loader maps), with the bytes of each whose
    pages the process touched. The maps are looked at on every import and library load, so a
    library takes its place near the module that loaded it."""

    def __init__(self):
        import sysconfig
        paths = sysconfig.get_paths()
        roots = {os.path.realpath(paths[k]) for k in ("purelib", "platlib") if paths.get(k)}
        self.roots = sorted(roots, key=len, reverse=True)
        self.order = []
        self.seen = set()
        self.whole = set()
        self.busy = False
        self.loading = False
        self.stopped = None
        sys.addaudithook(self.event)

    def under_roots(self, path):
        return any(path.startswith(r + "/") for r in self.roots)

    def add(self, path, whole):
        if path not in self.seen:
            self.seen.add(path)
            self.order.append(path)
        if whole:
            self.whole.add(path)

    def event(self, name, args):
        if self.busy or self.stopped is not None:
            return
        self.busy = True
        try:
            # An import or a dlopen is announced before it maps anything: what it mapped is
            # looked for at the next event, before that event's own file.
            if self.loading:
                for _, _, _, path in self.mappings():
                    self.add(path, False)
                self.loading = False
            if name == "open" and isinstance(args[0], str) and "r" in str(args[1] or "r"):
                path = os.path.realpath(args[0])
                if self.under_roots(path) and os.path.isfile(path):
                    self.add(path, True)
            elif name in ("import", "ctypes.dlopen"):
                self.loading = True
        except Exception:
            pass
        finally:
            self.busy = False

    def mappings(self):
        """(start, end, file offset, real path) of each mapping of a file under the roots."""
        out = []
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    path = parts[5].rstrip("\n")
                    if self.under_roots(path):
                        start, end = (int(x, 16) for x in parts[0].split("-"))
                        out.append((start, end, int(parts[2], 16), path))
        return out

    def touched(self):
        """Per mapped file, the set of its pages this process has in its page tables."""
        page = os.sysconf("SC_PAGE_SIZE")
        pages = {}
        with open("/proc/self/pagemap", "rb") as pagemap:
            for start, end, offset, path in self.mappings():
                pagemap.seek(start // page * 8)
                raw = pagemap.read((end - start) // page * 8)
                first = offset // page
                hit = pages.setdefault(path, set())
                for i in range(len(raw) // 8):
                    # Bit 63: present in memory; bit 62: swapped out.
                    if raw[i * 8 + 7] & 0xC0:
                        hit.add(first + i)
        return page, pages

    def stop(self):
        """Ends the record (once): what follows is the check's own reporting."""
        if self.stopped is not None:
            return self.stopped
        self.busy = True
        for _, _, _, path in self.mappings():
            self.add(path, False)
        page, pages = self.touched()
        files, outside_whole = [], 0
        for path in self.order:
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            read = size if path in self.whole else min(size, len(pages.get(path, ())) * page)
            root = next(r for r in self.roots if path.startswith(r + "/"))
            files.append({"path": "site-packages/" + path[len(root) + 1:], "size": size, "read": read})
        self.stopped = {"python": sys.version.split()[0], "site_packages": self.roots,
                        "torch": result.get("torch"), "steps": [], "files": files}
        for step in ("torch", "device_count", "gemm", "conv_rel_error", "allreduce"):
            if step in result:
                self.stopped["steps"].append(step)
        return self.stopped


recorder = StartupRecorder() if os.environ.get("GPUBAKE_RECORD_STARTUP") == "1" and rank == 0 else None


def stop_recording():
    if recorder is not None:
        result["startup"] = recorder.stop()


def finish():
    stop_recording()
    with open(out_path + ".part", "w") as f:
        json.dump(result, f)
    os.replace(out_path + ".part", out_path)


def failed(step, e):
    result.setdefault("errors", {})[step] = "".join(traceback.format_exception_only(type(e), e)).strip()


def mapped():
    """Every shared object this process maps, with the version its file name or the library
    itself gives."""
    import ctypes
    paths = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and ".so" in parts[-1] and parts[-1] not in paths:
                paths.append(parts[-1])
    calls = {"libnccl.so": ("ncclGetVersion", 0), "libcudart.so": ("cudaRuntimeGetVersion", 0),
             "libcuda.so": ("cuDriverGetVersion", 0), "libcudnn.so": ("cudnnGetVersion", 1)}
    out = []
    for p in paths:
        name = os.path.basename(p)
        entry = {"path": p, "real": os.path.realpath(p)}
        m = re.search(r"\.so\.([0-9][0-9.]*)$", os.path.basename(entry["real"]))
        if m:
            entry["file_version"] = m.group(1)
        for prefix, (symbol, plain) in calls.items():
            if name.startswith(prefix):
                try:
                    lib = ctypes.CDLL(p)
                    fn = getattr(lib, symbol)
                    if plain:
                        fn.restype = ctypes.c_size_t
                        entry["reports"] = int(fn())
                    else:
                        v = ctypes.c_int(0)
                        if fn(ctypes.byref(v)) == 0:
                            entry["reports"] = v.value
                except Exception as e:
                    entry["reports_error"] = str(e)
        out.append(entry)
    return out


def wheel_libraries():
    """Every shared object under the interpreter's own site-packages (what the image's wheels
    installed), by real path: the copies the mapped libraries are held to."""
    import sysconfig
    roots = []
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p and os.path.isdir(p) and os.path.realpath(p) not in roots:
            roots.append(os.path.realpath(p))
    files = []
    for root in roots:
        for d, _, names in os.walk(root):
            files.extend(os.path.join(d, n) for n in names if re.search(r"\.so(\.|$)", n))
    return {"site_packages": roots, "files": sorted(files)}


try:
    import torch
except Exception as e:
    failed("import", e)
    finish()
    sys.exit(0)

result["torch"] = torch.__version__
result["cuda"] = torch.version.cuda
try:
    result["cudnn"] = torch.backends.cudnn.version()
except Exception as e:
    failed("cudnn_version", e)
try:
    # torch.cuda.init raises with CUDA's own error where is_available only says False.
    torch.cuda.init()
    result["device_count"] = torch.cuda.device_count()
except Exception as e:
    failed("cuda_init", e)
    stop_recording()
    result["maps"] = mapped()
    result["wheel_libraries"] = wheel_libraries()
    finish()
    sys.exit(0)

dev = torch.device("cuda", local)
torch.cuda.set_device(dev)
result["capability"] = list(torch.cuda.get_device_capability(dev))
result["device_name"] = torch.cuda.get_device_name(dev)
result["arch_list"] = torch.cuda.get_arch_list()
try:
    result["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
except Exception as e:
    failed("nccl_version", e)


def timed(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


try:
    # A small case against a CPU reference, then the rate on a large one.
    g = torch.Generator().manual_seed(7)
    a = torch.randn(256, 256, generator=g).to(torch.bfloat16)
    b = torch.randn(256, 256, generator=g).to(torch.bfloat16)
    want = a.float() @ b.float()
    got = (a.to(dev) @ b.to(dev)).float().cpu()
    result["gemm_rel_error"] = float((got - want).abs().max() / want.abs().max())
    x = torch.randn(gemm_n, gemm_n, device=dev, dtype=torch.bfloat16)
    y = torch.randn(gemm_n, gemm_n, device=dev, dtype=torch.bfloat16)
    for _ in range(5):
        x @ y
    seconds = timed(lambda: x @ y, 20)
    result["gemm"] = {"n": gemm_n, "seconds": seconds, "tflops": 2 * gemm_n ** 3 / seconds / 1e12}
    del x, y
except Exception as e:
    failed("gemm", e)

try:
    g = torch.Generator().manual_seed(11)
    inp = torch.randn(2, 16, 32, 32, generator=g)
    w = torch.randn(32, 16, 3, 3, generator=g)
    want = torch.nn.functional.conv2d(inp, w, padding=1)
    got = torch.nn.functional.conv2d(inp.to(dev), w.to(dev), padding=1).cpu()
    result["conv_rel_error"] = float((got - want).abs().max() / want.abs().max())
    result["cudnn_enabled"] = bool(torch.backends.cudnn.enabled and torch.backends.cudnn.is_available())
except Exception as e:
    failed("conv", e)

try:
    import torch.distributed as dist
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    t = torch.full((1024,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    result["allreduce_sum"] = float(t[0])
    result["allreduce_expected"] = world * (world + 1) / 2
    rows = []
    for size in sizes:
        buf = torch.ones(size // 4, device=dev, dtype=torch.float32)
        for _ in range(2):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        dist.barrier()
        seconds = timed(lambda: dist.all_reduce(buf), 10)
        algbw = size / seconds / 1e9
        rows.append({"bytes": size, "seconds": seconds, "algbw": algbw,
                     "busbw": algbw * 2 * (world - 1) / world})
        del buf
    result["allreduce"] = rows
    dist.destroy_process_group()
except Exception as e:
    failed("allreduce", e)

stop_recording()
result["maps"] = mapped()
result["wheel_libraries"] = wheel_libraries()
finish()
