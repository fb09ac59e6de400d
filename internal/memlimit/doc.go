// Package memlimit reads the memory limit of the cgroup the process runs in.
//
// The Go runtime told it (runtime/debug.SetMemoryLimit) collects garbage
// harder as the process nears it, instead of letting the kernel's OOM
// killer end the process: a node daemon's deployment sets such a limit
// (a Kubernetes container's resources.limits.memory, a Nomad task's
// resources.memory, systemd's MemoryMax=), and the runtime, which bounds
// GOMAXPROCS by the cgroup's CPU limit, does not read its memory limit.
//
// It reads two or three files of cgroup v1's or v2's interface by hand: a
// library for it (automemlimit and its dependencies) would add modules to
// every App for what these few lines do (docs/DESIGN.md, "Written by
// hand").
package memlimit
