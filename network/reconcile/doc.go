// Package reconcile runs the background loop that finishes what reclaim
// deferred and what the pool could not remove.
//
// Each pass surveys the host, tears down the slots of quarantined indices,
// any stray resources of free indices (a host link whose namespace is gone,
// a set element without a slot, a netns file nobody owns) and every slot
// beyond the configured number (left by a run with a larger Config.Slots), and
// frees in the allocator every quarantined index whose slot is now
// completely gone. Indices that are acquired (warm in the pool or in use)
// are never touched; entries that cannot be inspected are never touched and
// their indices stay quarantined.
//
// Nothing a pass cannot do is dropped. A Pass carries the scan's error, the
// per-slot failures, the unreadable entries and the teardown's result (with
// its /proc scan and wait errors); Run hands every pass to Options.OnPass,
// and Last returns the latest. What a caller should do with them: log a
// failed scan (Pass.Scan) and each Failed and Unreadable entry at warning
// level with the slot index and error; log Teardown.ProcScan at warning
// level (at most once per distinct error: on some hosts a process such as a
// sandbox's init can never be read), Claimed and Beyond at info, Freed at
// debug; count passes by result and slots by outcome (freed, claimed,
// beyond, failed, unreadable).
package reconcile
