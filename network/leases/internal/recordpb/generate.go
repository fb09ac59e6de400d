// Package recordpb is the generated Go code of the lease store's record
// encoding (record.proto).
//
// Regenerate with `go generate ./network/leases/...`: the protoc plugins are
// pinned in tools/proto/go.mod, protoc is Debian's protobuf-compiler.
package recordpb

//go:generate ../../../../tools/proto/generate.sh record.proto
