#!/usr/bin/env bash
# The probe image (`pytorch: none`) on a GPU machine without a container engine: its layers
# are unpacked into a root, the driver's NVML and libcuda are copied in at their sonames and
# /dev, /proc and /sys mounted, as nvidia-container-toolkit gives a container, and the image's
# entrypoint runs in a chroot. What it shows: the probe on the glibc base loads the driver's
# libraries and checks the GPU. Writes probe.json and probe.err under OUTDIR.
# usage: benches/h200-probe-image.sh LAYOUT OUTDIR   (LAYOUT: an OCI layout of the image)
set -uo pipefail
layout=$(realpath "$1")
out=$(realpath -m "$2")
mkdir -p "$out"
root=$(mktemp -d)/rootfs
mkdir -p "$root"
manifest=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['manifests'][0]['digest'][7:])" "$layout/index.json")
for layer in $(python3 -c "import json,sys; print(' '.join(l['digest'][7:] for l in json.load(open(sys.argv[1]))['layers']))" "$layout/blobs/sha256/$manifest"); do
  tar -xzf "$layout/blobs/sha256/$layer" -C "$root" --exclude='./dev/*'
done
echo "root: $(du -sh "$root" | cut -f1)"
mkdir -p "$root/usr/lib/x86_64-linux-gnu" "$root/proc" "$root/sys" "$root/dev"
for lib in libnvidia-ml.so.1 libcuda.so.1; do
  src=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')
  echo "$lib <- $(readlink -f "$src")"
  cp -L "$src" "$root/usr/lib/x86_64-linux-gnu/$lib"
done
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
nvidia-smi -L
chroot=$(command -v chroot)
env -i PATH=/usr/local/bin:/usr/bin:/bin NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility \
  "$chroot" "$root" /usr/local/bin/gpubake probe --quick --json >"$out/probe.json" 2>"$out/probe.err"
echo "probe exit: $?"
umount -l "$root/proc" "$root/sys" "$root/dev"
python3 - "$out/probe.json" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1]))["checks"]:
    print(f"{c['status']:5} {c['phase']}: {c['name']}: {c['detail'][:110]}")
PY
