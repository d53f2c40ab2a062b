#!/usr/bin/env bash
# `gpubake preflight` on a GPU machine's own root: the H200 machines have the driver and no
# container engine or toolkit. Records what the machine has (the module's version, the NVML
# library its loader finds, the programs, device nodes and CDI directories), the preflight's
# report before and after a CDI spec is written for the machine (benches/lib.sh, as
# `nvidia-ctk cdi generate` would), and the wall time of ten runs.
# usage: benches/h200-preflight.sh BINARY OUTDIR
set -uo pipefail
bin=$(realpath "$1")
out=$(realpath -m "$2")
mkdir -p "$out"
. "$(dirname "$0")/lib.sh"

{
  echo "# the module"
  head -1 /proc/driver/nvidia/version
  echo "# the loader's NVML"
  ldconfig -p | grep libnvidia-ml || echo "ldconfig -p lists no libnvidia-ml"
  ls -l /usr/local/nvidia/lib64/libnvidia-ml.so* /usr/lib/x86_64-linux-gnu/libnvidia-ml.so* 2>&1
  echo "# programs"
  for p in dockerd containerd crio podman nvidia-ctk nvidia-container-runtime \
    nvidia-container-runtime-hook nvidia-cdi-hook runc crun; do
    printf '%s: %s\n' "$p" "$(command -v "$p" || echo none)"
  done
  echo "# device nodes"
  ls -l /dev/nvidia* /dev/char 2>&1 | head -40
  echo "# CDI directories"
  ls -l /etc/cdi /var/run/cdi 2>&1
  echo "# cgroup"
  ls /sys/fs/cgroup/cgroup.controllers /run/systemd/system 2>&1
} >"$out/machine.txt" 2>&1

"$bin" preflight >"$out/before.txt" 2>&1
echo "exit $?" >>"$out/before.txt"

spec=/var/run/cdi/gpubake-h200-preflight.yaml
mkdir -p /var/run/cdi
write_cdi_spec "$spec" "${DRIVER_DIR:-/usr/local/nvidia/lib64}" >>"$out/machine.txt"
cp "$spec" "$out/spec.yaml"
"$bin" preflight >"$out/after.txt" 2>&1
echo "exit $?" >>"$out/after.txt"
"$bin" preflight --json >"$out/after.json" 2>/dev/null

for i in 1 2 3 4 5 6 7 8 9 10; do
  start=$EPOCHREALTIME
  "$bin" preflight --json >/dev/null 2>&1
  end=$EPOCHREALTIME
  awk -v i="$i" -v a="$start" -v b="$end" 'BEGIN { printf "run %d: %.3f s\n", i, b - a }'
done >"$out/times.txt"
rm -f "$spec"
cat "$out/machine.txt" "$out/before.txt" "$out/after.txt" "$out/times.txt"
