package pool

import (
	"fmt"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/slot"
)

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

// Adopt takes slot s, whose index is quarantined (a slot held because
// something lives in it), as handed out: an operator adopted it back as a
// lease, and Put gives it back from then on. An index that is not
// quarantined fails, and nothing changes.
func (p *Pool) Adopt(s *slot.Slot) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inUse[s.Index] != nil || p.lost[s.Index] {
		return fmt.Errorf("%w: slot %d is handed out already", ErrNotFromPool, s.Index)
	}
	if err := p.idx.Unquarantine(s.Index); err != nil {
		return fmt.Errorf("pool: adopt slot %d: %w", s.Index, err)
	}
	p.inUse[s.Index] = s
	return nil
}

// HoldLost quarantines the index of a lost lease (Options.Lost, or Lose)
// once the lease has ended, instead of giving it back (PutLost): what is
// at the index is held, something living in it, and must not be made
// over. The reconciler's Keep leaves it alone; an operator releases it.
func (p *Pool) HoldLost(i int) error {
	if err := p.takeLost(i); err != nil {
		return err
	}
	if err := p.idx.Quarantine(i); err != nil {
		return fmt.Errorf("pool: hold lost index %d: %w", i, err)
	}
	return nil
}

// takeLost takes i off the lost leases' indices, which it must be on
// (ErrNotFromPool): an index is given back or held once.
func (p *Pool) takeLost(i int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.lost[i] {
		return fmt.Errorf("%w: %d is not a lost lease's index", ErrNotFromPool, i)
	}
	delete(p.lost, i)
	return nil
}
