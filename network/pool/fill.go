package pool

import (
	"context"
	"errors"
	"fmt"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/slot"
)

// kick starts fill workers while the pool is below target. Call with p.mu
// held.
func (p *Pool) kick() {
	if p.waitForLull() {
		return
	}
	for !p.closed && p.retry == nil && !p.exhausted && p.filling < p.opts.FillConcurrency &&
		len(p.idle)+p.filling < p.opts.Target {
		p.filling++
		p.wg.Add(1)
		go p.fillOne()
	}
}

// waitForLull reports whether the background fill waits for the Gets to
// pause (Options.Lull) and, when it does, arms the timer that kicks the
// fill once they have. Call with p.mu held.
func (p *Pool) waitForLull() bool {
	if p.opts.Lull < 0 || p.lastGet.IsZero() || len(p.idle) < p.reserve() ||
		len(p.idle)+p.filling >= p.opts.Target {
		return false
	}
	wait := p.lastGet.Add(p.opts.Lull).Sub(p.opts.Clock.Now())
	if wait <= 0 {
		return false
	}
	if p.lullTimer == nil && !p.closed {
		p.lullTimer = p.opts.Clock.AfterFunc(wait, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.lullTimer = nil
			p.kick()
		})
	}
	return true
}

// Reserve is the idle count below which a pool of target slots refills
// without waiting for a lull in Gets ([Options.Lull]): a quarter of the
// target, rounded up, so that a burst longer than the pool is deep still
// finds warm slots while the fill makes more.
func Reserve(target int) int { return (target + 3) / 4 }

func (p *Pool) reserve() int { return Reserve(p.opts.Target) }

func (p *Pool) fillOne() {
	defer p.wg.Done()
	p.makeIdle()
}

// makeIdle creates a slot and puts it on top of the idle stack, for a fill
// worker or a replacement (the caller counted it in p.filling). A failure
// arms the fill's backoff; no free index stops the fill until one comes
// back (a full node is no failure: nothing is retried, nothing is wrong).
func (p *Pool) makeIdle() {
	s, err := p.create(p.ctx, true)
	p.mu.Lock()
	p.filling--
	if errors.Is(err, index.ErrExhausted) {
		p.exhausted = true
		p.broadcast()
		p.mu.Unlock()
		return
	}
	if err != nil {
		p.lastErr = err
		if p.retry == nil && !p.closed {
			d := p.backoff
			p.backoff = min(2*p.backoff, p.opts.MaxBackoff)
			p.retry = p.opts.Clock.AfterFunc(d, func() {
				p.mu.Lock()
				defer p.mu.Unlock()
				p.retry, p.exhausted = nil, false // a retry looks for a free index again
				p.kick()
			})
		}
		p.broadcast()
		p.mu.Unlock()
		return
	}
	if p.closed && !p.keep {
		p.mu.Unlock()
		p.addCloseErr(p.destroy(context.Background(), s))
		return
	}
	p.backoff = p.opts.MinBackoff
	p.idle = append(p.idle, idleSlot{s: s, since: p.opts.Clock.Now()})
	p.scheduleTrim()
	p.broadcast()
	p.kick()
	p.mu.Unlock()
}

// scheduleTrim arms the trim timer for when the oldest idle slot above
// target reaches the grace period. Call with p.mu held.
func (p *Pool) scheduleTrim() {
	if p.closed || p.trimTimer != nil || len(p.idle) <= p.opts.Target {
		return
	}
	d := p.idle[0].since.Add(p.opts.Grace).Sub(p.opts.Clock.Now())
	p.trimTimer = p.opts.Clock.AfterFunc(max(d, 0), p.trim)
}

// trim destroys, oldest first, the idle slots above target whose grace has
// run out.
func (p *Pool) trim() {
	p.mu.Lock()
	p.trimTimer = nil
	if p.closed {
		p.mu.Unlock()
		return
	}
	now := p.opts.Clock.Now()
	var victims []*slot.Slot
	for len(p.idle) > p.opts.Target && !p.idle[0].since.Add(p.opts.Grace).After(now) {
		victims = append(victims, p.idle[0].s)
		p.idle[0] = idleSlot{}
		p.idle = p.idle[1:]
	}
	p.scheduleTrim()
	if len(victims) == 0 {
		p.mu.Unlock()
		return
	}
	p.wg.Add(1)
	defer p.wg.Done()
	p.broadcast()
	p.mu.Unlock()
	// Not p.ctx: Close waits for this destroy rather than aborting it.
	if err := p.destroy(context.Background(), victims...); err != nil {
		p.mu.Lock()
		p.lastErr = err
		p.mu.Unlock()
	}
}

// WaitReady blocks until at least n slots are idle, ctx ends or the pool is
// closed. n may not exceed the target.
func (p *Pool) WaitReady(ctx context.Context, n int) error {
	if n > p.opts.Target {
		return fmt.Errorf("pool: wait for %d ready slots, target is %d", n, p.opts.Target)
	}
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return ErrClosed
		}
		have, ch, last := len(p.idle), p.changed, p.lastErr
		p.mu.Unlock()
		if have >= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("pool: %d of %d slots ready: %w (last fill error: %v)", have, n, ctx.Err(), last)
			}
			return fmt.Errorf("pool: %d of %d slots ready: %w", have, n, ctx.Err())
		}
	}
}
