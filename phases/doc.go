// Package phases is the phasegate daemon's composition root: its phases and background tasks.
//
// It holds the phases, their dependencies, what each builds and what each
// stop keeps, and wires the daemon's rooms together: the lease core
// (phases/lease), the Slots API (phases/slotsapi) and the CNI plugin's
// routes (phases/cniapi) over the pool and the durable records.
//
//	lock ──► listen ─────────────────────────────► register ──► serve
//	   \                                             ▲
//	    └──► reclaim ──► storage ──► populate ───────┘
//	                                    └─► background: verify-leases, verify-inside, reclaim-dead, reconcile, check-egress, watch-host, fill, leases, watch
//
// listen and serve are the [app.App]'s own phases; listen waits only for
// lock, so the port answers health checks within milliseconds while the
// host is restored. reclaim matches what is on the host with the records
// (network/leases): leased slots are restored to their owners untouched,
// recorded idle slots adopted, the rest reclaimed — in the background after
// serving by default. A stop keeps leased and warm slots, recorded; an
// upgrade (SIGHUP) hands the port and the lock to the new image.
// [Reclaim] and [Decommission] are the one-shot commands, under the same
// lock and records.
package phases
