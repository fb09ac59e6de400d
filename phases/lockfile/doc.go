// Package lockfile is a single-instance guard: an exclusive flock(2) on a
// file that also records the holder's pid.
//
// The daemon locks what it owns, the slots of one prefix in one netns
// directory ([SlotsPath], in [DefaultDir]), not its state directory: two
// daemons with different state directories but the same slots must never
// both run, and `phasegate reclaim` takes the same lock.
//
// The lock directory is one only root controls (internal/rootdir): a lock
// in a directory another user can write is that user's to take first, and
// would stop every start. Lock files are opened through the directory's
// descriptor, never through a link.
//
// The kernel releases a flock when its holder dies, however it dies, so a
// lock file left behind by a killed daemon never blocks the next one. The
// holder is named from the kernel's lock table, which has no window between
// the flock and the pid written into the file; the file is the fallback.
package lockfile
