#!/usr/bin/env bash
# Builds Jaeger v2 (the all-in-one `jaeger` program) from this tools module and
# caches the binary: a cold build takes ~10 minutes on 2 cores, so it is done
# once per machine. Prints the binary's path.
#
# Jaeger is built here, not with `go install …@version`, because its module
# has replace directives that `go install` refuses.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "github.com/jaegertracing/jaeger" { print $2 }' "$here/go.mod")
cache=${PHASEGATE_CACHE:-/var/cache/phasegate}
bin="$cache/jaeger-$version"
if [ ! -x "$bin" ]; then
  mkdir -p "$cache"
  echo "building jaeger $version into $bin (first time on this machine: ~10 min)" >&2
  (cd "$here" && go build -trimpath -o "$bin.tmp.$$" github.com/jaegertracing/jaeger/cmd/jaeger)
  mv -f "$bin.tmp.$$" "$bin"
fi
echo "$bin"
