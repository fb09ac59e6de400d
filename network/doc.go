// Package network holds phasegate's network layer.
//
// It holds slots made of a named network namespace, a veth pair and an
// nftables set element, and the machinery that creates, pools, reclaims and
// reconciles them on a real Linux kernel.
//
// The subpackages each have one job and import one way:
//
//	netns     create/delete/list named network namespaces the way iproute2 does
//	nft       the per-prefix inet table, its ifname set and its rules
//	          (tenant isolation: what slots may reach)
//	egress    the one egress policy type: parsed, checked, fingerprinted,
//	          converted to and from its protobuf forms; what a policy lets out
//	inside    the tables inside one slot's namespace (a guest's NAT, a policy)
//	hostcheck a start-up check of what the slots' egress needs from the host
//	slot      configuration, addressing, Create/Destroy of one slot,
//	          scans and the batched teardown used by everything below
//	reclaim   find slots leaked by an earlier run and tear them down
//	index     the slot-index allocator with quarantine (in memory)
//	pool      a LIFO pool of warm slots with background fill and trim
//	reconcile a background loop that finishes quarantined slots and sweeps strays
//	leases    the durable records of slots and leases (bbolt)
//
// A daemon calls, in this order: slot.Config.Validate, slot.NewManager,
// hostcheck.Check (logging its problems), reclaim.Run, index.New (quarantining Report.Quarantine()), pool.New,
// Pool.WaitReady, Pool.Get/Put, a reconcile.Reconciler's Run loop and, at
// shutdown, Pool.Close. Nothing here knows about phases, gRPC or health,
// nor the daemon's flags: a setting that cannot be used is a SettingError
// naming the Go field, which the daemon shows as its flag.
//
// The test module's netbench (test/netbench) measures the layer on the real
// kernel through this API and writes docs/benchmarks/network.md; it lives
// there so that the library module carries no benchmark program.
// internal/nettest is the tests' playground (a unique prefix, a temporary
// netns directory, a sweep on cleanup).
//
// Everything that touches the kernel needs root (CAP_SYS_ADMIN and
// CAP_NET_ADMIN) and never shells out to ip or nft.
package network
