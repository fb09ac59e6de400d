// Package test holds phasegate's end-to-end tests: they build the phasegate
// binary and drive it as an operator would, on the real kernel, with real
// clients (HTTP, gRPC, grpc-health-probe) and a real Jaeger.
//
// They need root. Every test makes its kernel objects under a prefix of its
// own, in a netns directory of its own, and removes everything with that
// prefix when it ends, whether it passed or not. No traffic leaves loopback.
package test
