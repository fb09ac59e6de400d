#!/usr/bin/env bash
# Builds the Consul agent from the Go module proxy and caches the binary
# outside the tree: a cold build takes minutes on 2 cores, so it is done once
# per machine. Prints the binary's path.
#
# Consul is not `go install`-able: its go.mod replaces nested modules
# (api, sdk, envoyextensions, …) that the module zip does not contain. So the
# module is copied out of the module cache, its replace lines are dropped and
# the published api that matches its in-tree api is required instead (the
# v1.21.0 it asks for lags behind). No source is changed.
set -euo pipefail
version=v1.15.4
api=v1.23.0
cache=${PHASEGATE_CACHE:-/var/cache/phasegate}
bin="$cache/consul-$version"
# Its first line of `consul version`, read whole (a pipe into head could
# cut consul off with SIGPIPE, which pipefail would count as a failure).
first_line() { local out; out=$("$1" version 2>/dev/null) || return 1; echo "${out%%$'\n'*}"; }
if [ -x "$bin" ] && [ "$(first_line "$bin")" = "Consul $version" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache"
echo "building consul $version into $bin (first time on this machine: a few minutes)" >&2
dir=$(go mod download -json "github.com/hashicorp/consul@$version" |
  awk -F'"' '$2 == "Dir" { print $4 }')
# The licence is checked, not assumed: a later release changed it (BUSL).
if [[ "$(head -3 "$dir/LICENSE")" != *"Mozilla Public License, version 2.0"* ]]; then
  echo "consul $version: LICENSE is not the MPL-2.0" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'chmod -R u+w "$work"; rm -rf "$work" "$bin.tmp.$$"' EXIT
cp -r "$dir/." "$work/src"
chmod -R u+w "$work/src"
cd "$work/src"
# The five replace lines sit in one block; each points at a ./nested module.
drops=$(awk '/^replace \(/ { in_ = 1; next } in_ && /^\)/ { in_ = 0 } in_ { print "-dropreplace=" $1 }' go.mod)
[ -n "$drops" ] || { echo "consul $version: no replace lines found in go.mod" >&2; exit 1; }
go mod edit $drops
go mod edit -require="github.com/hashicorp/consul/api@$api"
GOFLAGS=-mod=mod go build -trimpath -o "$bin.tmp.$$" .
got=$(first_line "$bin.tmp.$$")
[ "$got" = "Consul $version" ] || { echo "built consul says $got, want Consul $version" >&2; exit 1; }
mv -f "$bin.tmp.$$" "$bin"
echo "$bin"
