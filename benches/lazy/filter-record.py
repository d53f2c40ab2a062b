"""A start-up record restricted to the files an image holds: the record taken on a GPU node
names every package's metadata that `import torch` scans (entry points), and the bench image
installs only torch and the packages the start-up itself imports. Prints what it dropped.
usage: python3 filter-record.py RECORD.json LAYOUT TAG OUT.json"""
import gzip
import json
import os
import re
import sys
import tarfile

record_path, layout, tag, out = sys.argv[1:]
# Where gpubake installs the stack, for any Python release.
SITE_PACKAGES = re.compile(r"opt/gpubake/venv/lib/python3\.\d+t?/site-packages/")


def blob(digest):
    return os.path.join(layout, "blobs", *digest.split(":"))


index = json.load(open(os.path.join(layout, "index.json")))
desc = next(m for m in index["manifests"]
            if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
manifest = json.load(open(blob(desc["digest"])))
held = set()
for layer in manifest["layers"]:
    with gzip.open(blob(layer["digest"])) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            found = SITE_PACKAGES.match(name)
            if found and member.isfile():
                held.add("site-packages/" + name[found.end():])
record = json.load(open(record_path))
kept = [f for f in record["files"] if f["path"] in held]
dropped = [f for f in record["files"] if f["path"] not in held]
record["files"] = kept
json.dump(record, open(out, "w"), indent=1)
print(f"kept {len(kept)} of {len(kept) + len(dropped)} recorded files "
      f"({sum(f['read'] for f in kept):,} of {sum(f['read'] for f in kept + dropped):,} bytes read)")
for f in dropped:
    print(f"  not in the image: {f['path']} ({f['read']} bytes read)")
