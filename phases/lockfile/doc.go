// Package lockfile is a single-instance guard: an exclusive flock(2) on a
// file that also records the holder's pid.
//
// The kernel releases a flock when its holder dies, however it dies, so a
// lock file left behind by a killed daemon never blocks the next one; the pid
// in the file only names the holder in the error a second instance reports.
package lockfile
