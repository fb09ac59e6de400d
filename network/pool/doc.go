// Package pool keeps a LIFO pool of warm network slots, after buildkit's
// netns pool.
//
// The pool fills itself in the background up to a target size with bounded
// concurrency, backing off after errors. While Gets come in a burst, the
// fill waits for them to pause (Options.Lull) as long as the pool holds a
// quarter of its target, so that its kernel work does not compete with the
// burst it refills for. Get hands out the most recently
// made idle slot first (so a quiet pool can shrink) and creates one on
// demand when the pool is empty. When the pool is above its target, the
// slots idle for longer than a grace period are destroyed, oldest first.
// Close stops filling, destroys every idle slot and any slot being created
// at that moment, waits for all of it and returns the joined errors; Get
// after Close fails with ErrClosed.
//
// # A slot given back is recreated, never reset
//
// A tenant can change nearly everything in its namespace: addresses of both
// families, routes in any table, policy rules, links, nftables and
// iptables rulesets (legacy x_tables ones too), any of the several hundred
// sysctls under /proc/sys/net, neighbours, conntrack entries, XFRM state,
// qdiscs on eth0. An in-place reset has to know and undo each of these,
// and misses what the next kernel adds. Worse, it cannot take the namespace
// back from whoever still holds it: a process the tenant left inside, a
// descriptor on the namespace (a bind mount elsewhere, /proc/<pid>/ns/net
// kept open, a process that setns's back in later), or a socket created in
// it and passed elsewhere. Any of these would see the next tenant's
// traffic.
//
// So Put tears the slot down and the pool makes a fresh one in its place: a
// new namespace object and a new veth pair at the next free index (usually
// the same index: the allocator hands out the most recently freed first).
// The next owner gets a namespace no one else has ever held, clean by
// construction. The old namespace outlives its file only while something
// holds it, and then it has no veth any more: the teardown deletes the host
// link of a namespace it finds held (processes inside are killed when
// Options.Teardown.KillOrphans is set, cut off otherwise), and an index is
// reused only once its host link is gone. The host's conntrack entries for
// the slot's address are flushed when the fresh slot is made, before it can
// carry traffic.
//
// The price is kernel work: a namespace and a veth pair made and destroyed
// per release instead of a few netlink calls in place. Measured side by
// side (docs/benchmarks/recycle.md), it is about what an in-place reset
// that covers only the sysctls already costs: reading and comparing the
// ~700 sysctls of a namespace takes longer than making a new one. Put
// returns once its slot is torn down and its replacement is on top of the
// idle stack (usually at the same index: the allocator hands out the index
// freed last), so the next Get hands out the index just given back, as
// before, and concurrent Puts share one batched teardown. Replacements
// count like the slots they replace: the idle stack can grow above the
// target after a burst and is trimmed after the grace period, as
// buildkit's is.
//
// # A full node
//
// When every index is handed out, lost or quarantined, the fill has
// nothing to make a slot at. That is no failure: it stops without an
// error or a backoff (Level.Exhausted) and resumes the moment an index
// comes back (Put, Retire, Discard, PutLost, RetireLost, Free), and a Get
// on an empty pool fails at once with index.ErrExhausted. Level and
// Changed let a caller follow the pool (a health check, a metric) at no
// cost per slot.
//
// Slots are never destroyed while the pool's lock is held. Every goroutine
// the pool starts is accounted for and finished by Close.
package pool
