package pool

import "github.com/phasegate/phasegate/network/index"

// Free returns a quarantined index to the free ones once its slot is gone,
// torn down by someone else than the pool: the background reclaim of the
// dead slots, the reconciler. A fill that stopped for want of a free index
// resumes.
func (p *Pool) Free(i int) error {
	if err := p.idx.Free(i); err != nil {
		return err
	}
	p.mu.Lock()
	p.indexBack()
	p.mu.Unlock()
	return nil
}

// QuarantineIfFree claims i for a teardown outside the pool if it is free,
// and reports whether it did: the reconciler claims a stray's index so that
// no Get makes a slot there meanwhile.
func (p *Pool) QuarantineIfFree(i int) bool {
	return p.idx.QuarantineIfFree(i)
}

// State returns the allocator's state of index i.
func (p *Pool) State(i int) (index.State, error) {
	return p.idx.State(i)
}

// Quarantined returns the quarantined indices in ascending order.
func (p *Pool) Quarantined() []int {
	return p.idx.Quarantined()
}

// Indices returns a consistent copy of the allocator's state, for an API
// that lists slots (the pool's own view is Snapshot).
func (p *Pool) Indices() index.Snapshot {
	return p.idx.Snapshot()
}
