// Package pool keeps a LIFO pool of warm network slots, after buildkit's
// netns pool.
//
// The pool fills itself in the background up to a target size with bounded
// concurrency, backing off after errors. Get hands out the most recently
// returned slot first (so a quiet pool can shrink) and creates one on demand
// when the pool is empty. Put resets what a user could have changed (links,
// addresses, routes, conntrack) and returns the slot; when the pool is above
// its target, the slots idle for longer than a grace period (default five
// minutes) are destroyed, oldest first. Close stops filling, destroys every
// idle slot and any slot being created at that moment, waits for all of it
// and returns the joined errors; Get after Close fails with ErrClosed.
//
// Slots are never destroyed while the pool's lock is held. Every goroutine
// the pool starts is accounted for and finished by Close.
package pool
