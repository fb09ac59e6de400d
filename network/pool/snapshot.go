package pool

import (
	"maps"
	"slices"
)

// Snapshot is a consistent view of the pool for an API that lists slots.
type Snapshot struct {
	// Target is the configured number of warm slots.
	Target int
	// Idle are the warm slots' indices, next Get first.
	Idle []int
	// InUse are the indices handed out and not yet returned, ascending.
	InUse []int
	// Creating are the indices being created, ascending.
	Creating []int
	// Retiring are the indices given back with Put whose teardown is not
	// over yet, ascending.
	Retiring []int
	// Filling is the number of background creations under way (their
	// index may not be acquired yet, so Creating can be shorter).
	Filling int
	// WaitingForLull: the pool is below target and its fill waits for the
	// Gets to pause (Options.Lull).
	WaitingForLull bool
	// Exhausted: the fill found no free index (every index is handed out,
	// lost or quarantined: a full node) and waits for one to come back.
	Exhausted bool
	// Closed is true after Close.
	Closed bool
	// LastError is the last fill or trim error (nil if none).
	LastError error
}

// Snapshot returns the pool's current state.
func (p *Pool) Snapshot() Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Snapshot{Target: p.opts.Target, Closed: p.closed, LastError: p.lastErr, Filling: p.filling,
		WaitingForLull: p.lullTimer != nil, Exhausted: p.exhausted}
	for k := len(p.idle) - 1; k >= 0; k-- {
		s.Idle = append(s.Idle, p.idle[k].s.Index)
	}
	s.InUse = slices.Sorted(maps.Keys(p.inUse))
	s.Creating = slices.Sorted(maps.Keys(p.creating))
	s.Retiring = slices.Sorted(maps.Keys(p.retiring))
	return s
}

// Level is how full the pool is at one moment, in counts only: read in
// O(1), where Snapshot lists every index handed out, for a caller that
// follows the pool at each change ([Pool.Changed]) or at each scrape.
type Level struct {
	// Target is the configured number of warm slots.
	Target int
	// Idle, InUse, Creating and Retiring count the slots as Snapshot
	// lists them; Filling the background creations under way.
	Idle, InUse, Creating, Retiring, Filling int
	// Free and Quarantined count the allocator's indices: those a slot
	// can be made at, and those no slot is made at until they are freed.
	Free, Quarantined int
	// Exhausted: as in Snapshot. With no idle slot, an Acquire fails at
	// once until an index comes back.
	Exhausted bool
	// Backoff: the last fill failed and the next waits; LastError says
	// why.
	Backoff   bool
	LastError error
	// Closed is true after Close or Stop.
	Closed bool
}

// Level returns the pool's counts now.
func (p *Pool) Level() Level {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.idx.Counts() // the allocator's lock is taken under the pool's, never the other way
	return Level{
		Target: p.opts.Target, Idle: len(p.idle), InUse: len(p.inUse), Creating: len(p.creating),
		Retiring: len(p.retiring), Filling: p.filling, Free: c.Free, Quarantined: c.Quarantined,
		Exhausted: p.exhausted, Backoff: p.retry != nil, LastError: p.lastErr, Closed: p.closed,
	}
}
