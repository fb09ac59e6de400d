// Package index is the slot-index allocator: indices 1..N, each free,
// acquired or quarantined. (The durable records of slots are another
// package, network/leases; this one keeps no state beyond the process.)
// It is built after reclaim from what still exists on the host: indices
// whose clean-up was deferred or failed are quarantined and never handed
// out until the reconciler frees them. It knows nothing of the kernel;
// foreign names never reach it. In the daemon the pool (network/pool) owns
// it once made: every later change of an index goes through the pool.
//
// Acquire and Release are O(1) (a stack of free indices beside a state
// array), safe for concurrent use, and hand out the lowest indices first on
// a fresh allocator.
package index
