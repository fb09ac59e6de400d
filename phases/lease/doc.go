// Package lease is the daemon's lease core: the leases of its slots as Go calls, speaking no wire.
//
// A [Service] holds the lease table over the pool (network/pool, which
// owns the slot indices) and the durable records (network/leases, written
// by [Records] alone). Its calls (Acquire, Attach, Release, KeepAlive,
// SetEgress, Get, List, End) take the caller the control surface's guard
// named (control.CallerFrom, read by the adapter) and a request, and answer
// a lease or an [*Error] whose [Kind] each adapter maps to its wire's code:
// phases/slotsapi to a gRPC status, phases/cniapi to a CNI error. The core
// also ends leases whose TTL ran out ([Service.RunExpiry]), checks the
// leases a start restored ([RestoreCheck]), keeps the slots held for the
// operator ([HeldSlots]) and notices leased slots broken from outside.
//
// An attachment's namespace is the CNI adapter's: the core calls it
// through [Target], between the slot's policy and its record.
package lease
