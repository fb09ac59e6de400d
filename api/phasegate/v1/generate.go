// Package phasegatev1 is the generated Go code of the phasegate.v1 API.
//
// Regenerate with `go generate ./api/...`: the protoc plugins are pinned in
// tools/proto/go.mod, protoc is Debian's protobuf-compiler.
package phasegatev1

//go:generate ../../../tools/proto/generate.sh slots.proto
