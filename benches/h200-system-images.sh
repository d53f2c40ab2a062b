#!/usr/bin/env bash
# Makes what benches/h200-system.sh carries to the GPU machine, on a machine with Debian's
# archive: three preflight images in one OCI layout (they share the base and the probe's
# layer), the release binary xz-compressed, and Debian's crun with its library as .debs. The
# base is Debian bookworm's minbase made small enough to carry: no docs, man pages or
# locales, and the files of perl's modules and of iconv's charsets removed (dpkg still lists
# those packages; nothing here runs them).
#   without  NCCL_IB_* settings, no system packages
#   with     the same settings, system: [rdma-core, ibverbs-providers, numactl, openssh-client]
#   roce     the roce preset (NCCL_NET=IB) with the same system packages
# Their locks pin PyTorch 2.11's stack (NCCL 2.28.9), which the machine's torch environment
# mounts into them (benches/h200-certify.sh).
# usage: benches/h200-system-images.sh BINARY OUTDIR
set -euo pipefail
bin=$(realpath "$1")
out=$(realpath -m "$2")
rm -rf "$out"
mkdir -p "$out/debs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export SOURCE_DATE_EPOCH=0

mmdebstrap --quiet --variant=minbase \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
  --customize-hook='rm -rf "$1"/usr/lib/x86_64-linux-gnu/perl "$1"/usr/share/perl "$1"/usr/lib/x86_64-linux-gnu/libperl.so* "$1"/usr/lib/x86_64-linux-gnu/gconv' \
  bookworm "$work/root.tar"
umoci init --layout "$work/base"
umoci new --image "$work/base:bookworm"
umoci raw add-layer --image "$work/base:bookworm" "$work/root.tar"
umoci config --image "$work/base:bookworm" --os linux --architecture amd64 \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

recipe() {
  cat >"$work/$1.yaml" <<YAML
name: ib-preflight-$1
base: debian:bookworm
python: "3.12"
pytorch: "2.11"
cuda: "13.0"
presets: $2
env:
  NCCL_IB_TIMEOUT: "22"
  NCCL_IB_RETRY_CNT: "7"
$3
YAML
}
packages='system: [rdma-core, ibverbs-providers, numactl, openssh-client]'
recipe without '[base]' ''
recipe with '[base]' "$packages"
recipe roce '[base, roce]' "$packages"
for image in without with roce; do
  "$bin" build --without-python "$work/$image.yaml" --from "oci:$work/base:bookworm" \
    --to "oci:$out/layout:$image" 2>&1 | grep -v '^note:' || true
  grep -q "\"$image\"" "$out/layout/index.json" || { echo "h200-system-images: $image did not build" >&2; exit 1; }
done
du -sh "$out/layout"
xz -T2 -9 -c "$bin" >"$out/gpubake.xz"
(cd "$out/debs" && apt-get download crun libyajl2 >/dev/null)
ls -la "$out" "$out/debs"
