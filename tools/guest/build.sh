#!/usr/bin/env bash
# Builds the microVM guest of the VM tests from Debian packages and caches it
# outside the tree, in $cache/guest/<kernel-version>/: vmlinuz (Debian's cloud
# kernel) and initrd.img (busybox-static, the virtio modules, ./init). Prints
# that directory.
#
# The kernel package is downloaded and unpacked (apt-get download, dpkg-deb
# -x), never installed: installed, it would become a boot candidate of the
# host. Its version is looked up (the newest cloud kernel the archive has),
# not hard-coded: old ones leave the archive. The lookup runs apt-get update,
# so it is done at most once a day; in between, the cached guest is printed
# at once. A guest whose init, busybox or kernel changed is rebuilt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${PHASEGATE_CACHE:-/var/cache/phasegate}/guest
# The virtio modules, in the order init loads them (each needs the ones before).
modules=(
  drivers/virtio/virtio_ring.ko
  drivers/virtio/virtio.ko
  drivers/virtio/virtio_pci_modern_dev.ko
  drivers/virtio/virtio_pci_legacy_dev.ko
  drivers/virtio/virtio_pci.ko
  net/core/failover.ko
  drivers/net/net_failover.ko
  drivers/net/virtio_net.ko
)

# What a built guest is made of: a change to any of these rebuilds it.
build_id() {
  local kver=$1
  { echo "kernel $kver"
    dpkg-query -W -f='busybox-static ${Version}\n' busybox-static
    sha256sum <"$here/init"
    sha256sum <"$here/build.sh"
  } | sha256sum | cut -d' ' -f1
}

# The cached guest of version $1 when it is complete and current.
cached() {
  local dir=$cache/$1
  [ -s "$dir/vmlinuz" ] && [ -s "$dir/initrd.img" ] && [ -f "$dir/build-id" ] &&
    [ "$(cat "$dir/build-id")" = "$(build_id "$1")" ]
}

if [ "$(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null)" != "install ok installed" ] ||
   [ "$(dpkg-query -W -f='${Status}' cpio 2>/dev/null)" != "install ok installed" ]; then
  echo "guest: busybox-static and cpio are needed (tools/deps.sh installs them)" >&2
  exit 1
fi

# Within a day of the last lookup, the version it found.
stamp=$cache/latest
if [ -f "$stamp" ] && [ -z "$(find "$stamp" -mmin +1440)" ] && cached "$(cat "$stamp")"; then
  echo "$cache/$(cat "$stamp")"
  exit 0
fi

# One build at a time: make test and deps may run it back to back.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

# When the archive cannot be read or the kernel fetched (no network), the
# guest built last is still good: it is used, with a warning.
fallback() {
  if [ -f "$stamp" ] && cached "$(cat "$stamp")"; then
    echo "guest: $1; using the cached $(cat "$stamp")" >&2
    echo "$cache/$(cat "$stamp")"
    exit 0
  fi
  echo "guest: $1" >&2
  exit 1
}

if [ "$(id -u)" = 0 ]; then
  apt-get update -qq || echo "guest: apt-get update failed; looking in the lists as they are" >&2
fi
pkg=$(apt-cache search --names-only '^linux-image-[0-9.]+-[0-9]+-cloud-amd64-unsigned$' |
  awk '{ print $1 }' | sort -V | tail -1)
[ -n "$pkg" ] || fallback "no linux-image-*-cloud-amd64-unsigned package in the apt archive"
kver=${pkg#linux-image-}
kver=${kver%-unsigned}
dir=$cache/$kver
if cached "$kver"; then
  echo "$kver" >"$stamp"
  echo "$dir"
  exit 0
fi

echo "guest: building $dir from $pkg and busybox-static" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
(cd "$work" && apt-get download -qq "$pkg" 2>&1 | grep -v 'unsandboxed' >&2 || true)
deb=$(ls "$work"/*.deb 2>/dev/null | head -1)
[ -n "$deb" ] || fallback "apt-get download $pkg gave no .deb"
dpkg-deb -x "$deb" "$work/kernel"
[ -s "$work/kernel/boot/vmlinuz-$kver" ] || { echo "guest: $pkg has no boot/vmlinuz-$kver" >&2; exit 1; }

root=$work/root
mkdir -p "$root/bin" "$root/lib/modules" "$root/tmp"
cp /bin/busybox "$root/bin/busybox"
for m in "${modules[@]}"; do
  src=$work/kernel/lib/modules/$kver/kernel/$m
  [ -f "$src" ] || { echo "guest: $pkg has no $m (compressed or moved?)" >&2; exit 1; }
  cp "$src" "$root/lib/modules/"
done
install -m 755 "$here/init" "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 >"$work/initrd.img")

# Into place whole: a reader sees the old guest or the new, never half.
mkdir -p "$dir.tmp.$$"
cp "$work/kernel/boot/vmlinuz-$kver" "$dir.tmp.$$/vmlinuz"
cp "$work/initrd.img" "$dir.tmp.$$/initrd.img"
build_id "$kver" >"$dir.tmp.$$/build-id"
rm -rf "$dir"
mv "$dir.tmp.$$" "$dir"
echo "$kver" >"$stamp"
echo "$dir"
