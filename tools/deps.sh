#!/usr/bin/env bash
# Installs what `make test` needs on a Debian machine that has Go: the Debian
# packages below (as root, with apt-get), grpc-health-probe and cnitool (go install) and
# cached Jaeger, Consul and microVM guest builds. Packages are checked by name with dpkg-query, not by
# command: libprotobuf-dev has no command, and a command of the same name
# from elsewhere would hide a missing package. Safe to run again: it does
# nothing when everything is there.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# Each package, and what needs it.
packages=(
  iproute2          # ip, ip netns: tests make and inspect veths and namespaces
  nftables          # nft: tests check and sweep the daemon's tables
  qemu-system-x86   # qemu-system-x86_64: the microVM guest of the VM tests (software accelerator)
  busybox-static    # the guest's whole userland (tools/guest/build.sh)
  cpio              # packs the guest's initramfs
  iptables          # iptables inside a slot: tests dirty a slot the way a tenant would
  util-linux        # unshare, nsenter, mount: leaked-slot fixtures, workloads inside slots;
                    # runuser: the control plane's attacks as an unprivileged user
  passwd            # groupdel: the systemd test removes the group the sysusers.d file made
  procps            # sysctl, ps: tests read and dirty per-namespace sysctls
  systemd           # systemd-socket-activate: socket activation tests; systemd-sysusers
                    # makes the control socket's group from the shipped sysusers.d file
  protobuf-compiler # protoc: the generated API code is checked against the .proto
  libprotobuf-dev   # google/protobuf/timestamp.proto, which protoc needs for the API
  chromium          # headless browser for the /debug/startup timeline test
  fonts-liberation  # fonts for the timeline screenshot
  gcc               # cgo, for go test -race
  libc6-dev         # cgo's C headers
  git               # gofmt check over the tracked files
  make
  ca-certificates   # module downloads over HTTPS
  podman            # a container runtime that attaches networks through CNI (its CNI backend here:
                    # no netavark), run by the CNI plugin's tests
  runc              # podman's and containerd's OCI runtime (crun refuses this host's hybrid cgroups)
  containerd        # ctr run --cni: the second runtime of the CNI plugin's tests
  containernetworking-plugins # the reference bridge and host-local plugins, measured beside phasegate's
  iperf3            # TCP throughput host<->slot: the bandwidth limits measured (network/shape)
)

missing=()
for p in "${packages[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "missing Debian packages: ${missing[*]}" >&2
    echo "run as root, or: apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
  echo "installing Debian packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

gobin=$(go env GOPATH)/bin
if [ ! -x "$gobin/grpc-health-probe" ]; then
  version=$(awk '$1 == "GRPC_HEALTH_PROBE_VERSION" { print $3 }' "$here/../Makefile")
  echo "installing grpc-health-probe $version into $gobin" >&2
  go install "github.com/grpc-ecosystem/grpc-health-probe@$version"
fi
# cnitool drives the CNI plugin's tests as a runtime would (every verb of
# spec 1.1), at the version of the CNI library the plugin is built with.
cni=$(awk '$1 == "github.com/containernetworking/cni" { print $2 }' "$here/../go.mod")
if [ "$(cat "$gobin/.cnitool-version" 2>/dev/null)" != "$cni" ] || [ ! -x "$gobin/cnitool" ]; then
  echo "installing cnitool $cni into $gobin" >&2
  go install "github.com/containernetworking/cni/cnitool@$cni"
  echo "$cni" >"$gobin/.cnitool-version"
fi

"$here/jaeger/build.sh" >/dev/null
"$here/consul/build.sh" >/dev/null
"$here/guest/build.sh" >/dev/null
