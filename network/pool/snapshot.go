package pool

import "slices"

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
	// Closed is true after Close.
	Closed bool
	// LastError is the last fill or trim error (nil if none).
	LastError error
}

// Snapshot returns the pool's current state.
func (p *Pool) Snapshot() Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Snapshot{Target: p.opts.Target, Closed: p.closed, LastError: p.lastErr, Filling: p.filling, WaitingForLull: p.lullTimer != nil}
	for k := len(p.idle) - 1; k >= 0; k-- {
		s.Idle = append(s.Idle, p.idle[k].s.Index)
	}
	for i := range p.inUse {
		s.InUse = append(s.InUse, i)
	}
	for i := range p.creating {
		s.Creating = append(s.Creating, i)
	}
	for i := range p.retiring {
		s.Retiring = append(s.Retiring, i)
	}
	slices.Sort(s.InUse)
	slices.Sort(s.Creating)
	slices.Sort(s.Retiring)
	return s
}
