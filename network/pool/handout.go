package pool

import (
	"context"
	"errors"
	"fmt"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/slot"
)

// Get returns the most recently returned idle slot, or creates one when the
// pool is empty. When every index is taken but some are being made into
// idle slots (a fill, or the replacement of a slot given back) or torn
// down, it waits for one of them rather than failing: a caller that just
// gave a slot back finds its index busy with the teardown or the
// replacement. It fails with ErrClosed after Close.
func (p *Pool) Get(ctx context.Context) (*slot.Slot, error) {
	for {
		s, filled, err := p.get(ctx)
		if filled == nil {
			return s, err
		}
		select {
		case <-filled:
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		}
	}
}

// get is one try of Get. When the indices are exhausted while slots are
// being filled, it returns the error with a channel that is closed at the
// next change of the pool, to try again then.
func (p *Pool) get(ctx context.Context) (*slot.Slot, <-chan struct{}, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, nil, ErrClosed
	}
	if n := len(p.idle); n > 0 {
		e := p.idle[n-1]
		p.idle[n-1] = idleSlot{}
		p.idle = p.idle[:n-1]
		p.inUse[e.s.Index] = e.s
		p.fromIdle[e.s.Index] = true
		p.lastGet = p.opts.Clock.Now()
		p.kick()
		p.broadcast()
		p.mu.Unlock()
		return e.s, nil, nil
	}
	p.wg.Add(1)
	defer p.wg.Done()
	p.kick()
	p.mu.Unlock()

	// On demand: abort when either the caller or Close says so.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(p.ctx, cancel)
	defer stop()
	s, err := p.create(cctx, false)
	if err != nil {
		if p.ctx.Err() != nil {
			return nil, nil, errors.Join(ErrClosed, err)
		}
		if errors.Is(err, index.ErrExhausted) {
			if filled := p.whenFilled(); filled != nil {
				return nil, filled, err
			}
		}
		return nil, nil, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, nil, errors.Join(ErrClosed, p.destroy(context.WithoutCancel(ctx), s))
	}
	p.inUse[s.Index] = s
	p.mu.Unlock()
	return s, nil, nil
}

// whenFilled is a channel closed when a Get should try again: at once if
// an idle slot is there already, at the pool's next change if one is
// being made, or a slot is being torn down (its index comes back, and its
// replacement is made); nil if neither, or the pool is closed.
func (p *Pool) whenFilled() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed || p.filling+len(p.idle)+len(p.retiring) == 0:
		return nil
	case len(p.idle) > 0:
		now := make(chan struct{})
		close(now)
		return now
	}
	return p.changed
}

// Return puts a slot handed out by Get back on top of the idle stack as it
// is: for a caller that could not hand it on (its own record failed, its
// client left), so no tenant ever had it. OnIdle is called first for a
// slot Get made on an empty pool; a slot it refuses is destroyed. One Get
// took from the idle stack went through OnIdle already and goes back
// without it (Options.OnIdle). After Close or Stop the slot is destroyed,
// or kept with the idle ones by Stop.
func (p *Pool) Return(s *slot.Slot) error {
	wasIdle, err := p.takeBack(s)
	if err != nil {
		return err
	}
	if p.closed && !p.keep {
		p.mu.Unlock()
		return p.destroy(context.Background(), s)
	}
	if !p.closed {
		// A Stop from now on waits for the slot to be kept. After one
		// (p.keep), the slot is recorded and kept all the same, as the
		// slots Stop keeps are; only Stop's list lacks it.
		p.wg.Add(1)
		defer p.wg.Done()
	}
	p.mu.Unlock()
	if p.opts.OnIdle != nil && !wasIdle {
		if err := p.opts.OnIdle(context.Background(), s); err != nil {
			return errors.Join(fmt.Errorf("pool: return slot %d: record: %w", s.Index, err), p.destroy(context.Background(), s))
		}
	}
	p.mu.Lock()
	if p.closed && !p.keep {
		p.mu.Unlock()
		return p.destroy(context.Background(), s)
	}
	p.idle = append(p.idle, idleSlot{s: s, since: p.opts.Clock.Now()})
	p.scheduleTrim()
	p.broadcast()
	p.mu.Unlock()
	return nil
}

// Put gives back a slot handed out by Get. The slot is never handed out
// again: Put tears it down (namespace, veth pair, set element; a process
// the tenant left inside is killed or cut off, see Options.Teardown) and
// makes a fresh slot in its place on top of the idle stack, usually at the
// same index, so the next Get hands out the index just given back, as
// before. Concurrent Puts are torn down together in one batch. Put returns
// once its slot is gone and its replacement made, with the teardown's
// error (the index is then quarantined; a failed replacement is the fill's
// LastError, not Put's); if ctx ends first, Put returns ctx's error and the
// work still finishes. After Close, Put only destroys the slot.
func (p *Pool) Put(ctx context.Context, s *slot.Slot) error {
	return p.giveBack(ctx, s, false)
}

// Retire is [Pool.Put] for a caller whose answer must not wait for the
// replacement (a CNI DEL or GC, answering a runtime): it returns once its
// slot is torn down, and the replacement is made after, as Put's is.
func (p *Pool) Retire(ctx context.Context, s *slot.Slot) error {
	return p.giveBack(ctx, s, true)
}

// Discard queues slot s, handed out by Get, for the teardown as Retire
// does, and returns at once: for a caller that answers before the
// teardown (a CNI DEL, once the attachment is cut off). The index is
// given back when the slot is torn down, or quarantined for the caller's
// reconciler if it cannot be; the pool makes a replacement, as for Put.
// It takes ctx for the signature of Put and Retire, and fails only as
// they do before queueing (a slot not handed out fails with
// ErrNotFromPool).
func (p *Pool) Discard(ctx context.Context, s *slot.Slot) error {
	_, err := p.queue(ctx, s, true)
	return err
}

// giveBack queues s for the retire loop and waits for its report: after
// the teardown (early) or after the replacement too.
func (p *Pool) giveBack(ctx context.Context, s *slot.Slot, early bool) error {
	r, err := p.queue(ctx, s, early)
	if r == nil {
		return err
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("pool: put slot %d: %w (its teardown goes on)", s.Index, ctx.Err())
	}
}

// queue takes s back and queues it for the retire loop, whose report
// comes on the retirement's done; after Close it destroys s at once and
// returns no retirement.
func (p *Pool) queue(ctx context.Context, s *slot.Slot, early bool) (*retirement, error) {
	if _, err := p.takeBack(s); err != nil {
		return nil, err
	}
	if p.closed {
		p.mu.Unlock()
		return nil, p.destroy(context.WithoutCancel(ctx), s)
	}
	r := &retirement{s: s, done: make(chan error, 1), early: early}
	p.retireQ = append(p.retireQ, r)
	p.retiring[s.Index] = true
	p.mu.Unlock()
	p.poke()
	return r, nil
}

// PutLost gives back the index of a lost lease (Options.Lost, or Lose) once the
// lease has ended: nothing of its slot is left on the host, so the index is
// free at once. An index the pool was not given as lost (or given back
// already) fails with ErrNotFromPool. It works after Close too: it only
// changes the allocator.
func (p *Pool) PutLost(i int) error {
	if err := p.takeLost(i); err != nil {
		return err
	}
	if err := p.idx.Release(i); err != nil {
		return fmt.Errorf("pool: give back lost index %d: %w", i, err)
	}
	p.mu.Lock()
	p.indexBack()
	p.mu.Unlock()
	return nil
}

// Lose turns a slot handed out (Options.InUse) into a lost lease's index:
// its objects were found gone or not the ones recorded, after the pool was
// made (a restored lease verified once the daemon serves). The index stays
// taken, with no slot, until PutLost gives it back. A slot not handed out
// by the pool fails with ErrNotFromPool.
func (p *Pool) Lose(s *slot.Slot) error {
	if s == nil {
		return fmt.Errorf("%w: nil slot", ErrNotFromPool)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inUse[s.Index] != s {
		return fmt.Errorf("%w: slot %d", ErrNotFromPool, s.Index)
	}
	delete(p.inUse, s.Index)
	delete(p.fromIdle, s.Index)
	p.lost[s.Index] = true
	p.broadcast()
	return nil
}

// RetireLost is PutLost for a lost lease whose index may still hold what
// is left of its slot: one lost while handed out ([Pool.Lose] of a slot
// broken from outside), whose remains (a host link to a namespace
// something keeps alive, the firewall element, an empty netns file) were
// left alone while the lease was held. They are torn down, as a slot
// given back with Put is (Options.Teardown), and the index given back, or
// quarantined for the caller's reconciler when they could not all be; no
// replacement is made but by the fill. An index the pool was not given as
// lost fails with ErrNotFromPool.
func (p *Pool) RetireLost(ctx context.Context, i int) error {
	p.mu.Lock()
	if !p.lost[i] {
		p.mu.Unlock()
		return fmt.Errorf("%w: %d is not a lost lease's index", ErrNotFromPool, i)
	}
	delete(p.lost, i)
	if !p.closed { // Close waits for it; after Close, nobody waits
		p.wg.Add(1)
		defer p.wg.Done()
	}
	p.mu.Unlock()
	return p.destroyIndices(ctx, []int{i})
}

// takeBack locks p.mu and takes s back from the slots handed out, and
// says whether Get took it from the idle stack; it returns with p.mu
// held, or, for a slot that is not handed out, unlocked with
// ErrNotFromPool.
func (p *Pool) takeBack(s *slot.Slot) (wasIdle bool, err error) {
	if s == nil {
		return false, fmt.Errorf("%w: nil slot", ErrNotFromPool)
	}
	p.mu.Lock()
	if p.inUse[s.Index] != s {
		p.mu.Unlock()
		return false, fmt.Errorf("%w: slot %d", ErrNotFromPool, s.Index)
	}
	wasIdle = p.fromIdle[s.Index]
	delete(p.inUse, s.Index)
	delete(p.fromIdle, s.Index)
	return wasIdle, nil
}
