// Package phases is the phasegate daemon: its seven startup phases, their
// dependencies, and what each builds and tears down.
//
//	lock ──► listen ─────────────────────────────► register ──► serve
//	   \                                             ▲
//	    └──► reclaim ──► storage ──► populate ───────┘
//
// listen and reclaim both wait only for lock: the port answers health checks
// within milliseconds while reclaim cleans the host, however long that takes.
// [Graph] declares the phases for the generic [lifecycle] engine; [Daemon]
// holds what they build (the lock, the server, the slot manager, storage,
// pool and reconciler) so that the stop functions can take it down in
// reverse order on drain.
package phases
