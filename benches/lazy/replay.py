"""Replays a start-up record (`gpubake probe --record-startup`) in an image without a GPU:
each recorded file in the order the start-up first touched it, read whole where the start-up
read at least half of it or it is no larger than a 4 MiB chunk (what gpubake prefetches),
else the recorded number of bytes as 4 KiB pages spread evenly over the file, as the pages a
process maps from a large library lie scattered through it.
usage: python3 replay.py RECORD.json   (run by the image's own Python)"""
import json
import site
import sys

PAGE = 4096
CHUNK = 4 << 20

record = json.load(open(sys.argv[1]))
root = next(p for p in site.getsitepackages() if p.endswith("site-packages"))
read = 0
for f in record["files"]:
    path = root + f["path"][len("site-packages"):]
    size, wanted = f["size"], f["read"]
    with open(path, "rb", buffering=0) as fh:
        if size <= CHUNK or wanted * 2 >= size:
            while True:
                got = fh.read(1 << 20)
                if not got:
                    break
                read += len(got)
        elif wanted:
            pages = max(1, wanted // PAGE)
            stride = size // pages
            for i in range(pages):
                fh.seek(i * stride)
                read += len(fh.read(PAGE))
print(f"replayed {len(record['files'])} files, {read} bytes", file=sys.stderr)
