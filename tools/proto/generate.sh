#!/usr/bin/env bash
# Runs protoc with the Go plugins pinned in this module, in the caller's
# directory, on the .proto files given. Used by `go generate ./api/...`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler" >&2; exit 1; }
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
(cd "$here" && go build -o "$bin/" google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc)
protoc -I . \
  --plugin=protoc-gen-go="$bin/protoc-gen-go" --go_out=. --go_opt=paths=source_relative \
  --plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" --go-grpc_out=. --go-grpc_opt=paths=source_relative \
  "$@"
