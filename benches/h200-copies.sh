#!/usr/bin/env bash
# Which copy of each CUDA library torch binds, as `gpubake probe --python` judges it on the
# machine's torch environment: once as the environment is, once with the CUDA toolkit's
# directory first on LD_LIBRARY_PATH (how an older or other CUDA's libnvJitLink reaches
# libcusparse), and once with the toolkit's libcusparse.so.12 preloaded (LD_PRELOAD maps that
# copy before any other, whatever torch asks for); each as JSON, with the framework checks
# printed. Changes nothing on the host.
# usage: benches/h200-copies.sh BINARY OUTDIR TAG
set -uo pipefail
bin=$1
out=$2
tag=$3
. "$(dirname "$0")/lib.sh"
mkdir -p "$out"
python=$(ls /opt/*/.venv/bin/python3 2>/dev/null | head -1)
cuda=$(ls -d /usr/local/cuda/lib64 2>/dev/null | head -1)
echo "  torch environment: $python; CUDA toolkit: ${cuda:-none}"
ls "${cuda:-/nonexistent}"/libnvJitLink.so* "${cuda:-/nonexistent}"/libcusparse.so* 2>/dev/null | sed 's/^/    /'
show() {
  python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for c in d["checks"]:
    if c["phase"] == "framework":
        print(f"    {c['status']:4}  {c['name']}: {c['detail'][:1500]}")
PY
}
/usr/bin/time -f "  probe --python --quick: %e s" "$bin" probe --quick --python "$python" --json \
  >"$out/copies-default-$tag.json"
echo "  exit $?"
show "$out/copies-default-$tag.json"
LD_LIBRARY_PATH="$cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  /usr/bin/time -f "  LD_LIBRARY_PATH=$cuda probe --python --quick: %e s" \
  "$bin" probe --quick --python "$python" --json >"$out/copies-ld-library-path-$tag.json"
echo "  exit $?"
show "$out/copies-ld-library-path-$tag.json"
LD_PRELOAD="$cuda/libcusparse.so.12" \
  /usr/bin/time -f "  LD_PRELOAD=$cuda/libcusparse.so.12 probe --python --quick: %e s" \
  "$bin" probe --quick --python "$python" --json >"$out/copies-preload-$tag.json"
echo "  exit $?"
show "$out/copies-preload-$tag.json"
