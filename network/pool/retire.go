package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/phasegate/phasegate/network/slot"
)

// retirement is a slot given back with Put or Retire, waiting to be torn
// down.
type retirement struct {
	s    *slot.Slot
	done chan error // 1-buffered: the teardown's outcome for this slot
	// early: done is sent once the slot is torn down (Retire), not once its
	// replacement is made too (Put).
	early bool
}

// poke wakes the retire loop.
func (p *Pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// retireLoop tears down the slots given back, all those queued at once in
// one Teardown (one /proc scan, one nftables transaction, the kernel's
// batched namespace clean-up), until the pool is closed and nothing is
// queued.
func (p *Pool) retireLoop() {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		for len(p.retireQ) == 0 {
			if p.closed {
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			<-p.wake
			p.mu.Lock()
		}
		batch := p.retireQ
		p.retireQ = nil
		p.mu.Unlock()
		p.retire(batch)
	}
}

// retire tears a batch down, gives the indices back (or quarantines them),
// reports to each Retire, makes a fresh slot for each slot torn down
// (FillConcurrency at a time), and then reports to each Put.
func (p *Pool) retire(batch []*retirement) {
	idx := make([]int, 0, len(batch))
	ss := make([]*slot.Slot, 0, len(batch))
	for _, r := range batch {
		idx = append(idx, r.s.Index)
		ss = append(ss, r.s)
	}
	// Not p.ctx: Close waits for the teardown rather than aborting it.
	res := p.slots.Teardown(context.Background(), slot.AssumeOf(ss...), p.opts.Teardown)
	p.gone(idx, res)
	errs := map[int]error{}
	for _, f := range res.Failed {
		errs[f.Index] = fmt.Errorf("pool: put slot %d: teardown: %w", f.Index, f.Err)
	}
	for _, i := range res.Deferred {
		errs[i] = fmt.Errorf("pool: put slot %d: teardown deferred by the teardown budget", i)
	}
	replace := 0
	for _, i := range res.Reclaimed {
		if err := p.idx.Release(i); err != nil {
			errs[i] = err
			continue
		}
		replace++
	}
	for i := range errs {
		if err := p.idx.Quarantine(i); err != nil {
			errs[i] = errors.Join(errs[i], err)
		}
	}
	p.mu.Lock()
	for _, i := range idx {
		delete(p.retiring, i)
	}
	if p.closed {
		replace = 0
	}
	if replace > 0 {
		p.exhausted = false // indices came back: the fill may find one
	}
	p.filling += replace // counted toward the target: kick makes no extra
	p.broadcast()
	p.mu.Unlock()
	for _, r := range batch {
		if r.early {
			r.done <- errs[r.s.Index]
		}
	}
	// The replacements, made here so that a Put returns with its fresh
	// slot on top of the idle stack (usually at the same index: the
	// allocator hands out the index freed last). A failure is the fill's
	// business (LastError, backoff), not the Put's: its slot is gone.
	var wg sync.WaitGroup
	sem := make(chan struct{}, p.opts.FillConcurrency)
	for range replace {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			p.makeIdle()
		})
	}
	wg.Wait()
	for _, r := range batch {
		if !r.early {
			r.done <- errs[r.s.Index]
		}
	}
}
