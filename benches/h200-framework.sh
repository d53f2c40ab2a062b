#!/usr/bin/env bash
# The framework phase on the machine's own PyTorch: `gpubake probe --python` on the torch
# environment of the machine's CUDA image, as JSON (with the libraries each rank mapped) and
# as text, each timed. Changes nothing on the host.
# usage: benches/h200-framework.sh BINARY OUTDIR TAG
set -uo pipefail
bin=$1
out=$2
tag=$3
. "$(dirname "$0")/lib.sh"
mkdir -p "$out"
python=$(ls /opt/*/.venv/bin/python3 2>/dev/null | head -1)
/usr/bin/time -f "  probe --python: %e s" "$bin" probe --python "$python" --json \
  >"$out/probe-framework-$tag.json"
echo "  exit $?"
/usr/bin/time -f "  probe --python --quick: %e s" "$bin" probe --quick --python "$python" \
  >"$out/probe-framework-quick-$tag.txt"
echo "  exit $?"
grep -A12 "^# framework" "$out/probe-framework-quick-$tag.txt"
