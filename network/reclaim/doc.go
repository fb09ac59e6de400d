// Package reclaim finds network slots leaked by an earlier run and tears
// them down before the allocator is built.
//
// A kill -9, a crash or a failed teardown leaks them.
//
// A slot is leaked when any of its resources exists: a netns file
// <prefix><i> (a bound network namespace or an empty regular file:
// symlinks, directories, files with content, foreign mounts and other names
// are look-alikes and untouched), a host link <prefix>h<i> (whose namespace
// file may be gone), or a set element naming one. The index i is written
// canonically and may be beyond N: a run with a larger Config.Slots left it; it
// is reclaimed and listed in Report.Beyond, never quarantined (the
// allocator covers [1, N] only). Entries that cannot be inspected are
// reported (Report.Unreadable), never touched, and quarantined.
//
// They are torn down at kernel speed (see slot.Manager.Teardown): netns
// files are detached and unlinked by bounded workers so the kernel destroys
// namespaces and veth pairs in batches, the host ends are awaited with a
// deadline, and all stale set elements go in one nftables transaction.
// Options.Batch hands the kernel the dead a batch at a time, for a reclaim
// that runs while slots are being created; Options.Pacer sizes the batches
// instead by what they do to the rest of the process (a Pacer, fed the
// waits its caller measures). Veths are deleted one by one only
// when something keeps their namespace alive; processes found inside are
// reported and ended only with Options.KillOrphans, each through a pidfd and
// only if it is still inside (netns.KillIn).
//
// A budget (time and/or count) bounds the work; the remainder is returned as
// Deferred for the background reconciler, and must be quarantined in the
// allocator (Report.Quarantine, which leaves out indices beyond N).
//
// Nothing Run could not read or do is dropped: Report.Unreadable (entries
// not inspected), Failed (per slot), ProcScan (an incomplete /proc scan) and
// WaitErr say it, for the caller to log and count.
package reclaim
