package pool

import (
	"context"
	"errors"
	"fmt"

	"github.com/phasegate/phasegate/network/slot"
)

// Close stops filling, destroys every idle slot and every slot being
// created, finishes the teardown of slots already given back, waits for
// in-flight work (or until ctx ends) and returns the joined errors. Slots
// handed out and not yet returned are not touched; Put destroys them later. If ctx ends first, Close returns ctx's error and
// the in-flight work still finishes (and cleans up) on its own. Close is
// idempotent; later calls return nil.
func (p *Pool) Close(ctx context.Context) error {
	_, err := p.close(ctx, false)
	return err
}

// Stop stops the pool without destroying its warm slots: filling stops,
// slots being created are destroyed unless they are made by then (they are
// then kept, OnIdle having recorded them), slots given back are torn down,
// and Stop waits for that (or until ctx ends). It returns the slots kept
// idle; slots handed out are not touched either. A daemon that restarts
// adopts them (Options.Idle). After Stop the pool behaves as after Close.
func (p *Pool) Stop(ctx context.Context) ([]*slot.Slot, error) {
	return p.close(ctx, true)
}

func (p *Pool) close(ctx context.Context, keep bool) ([]*slot.Slot, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, nil
	}
	p.closed, p.keep = true, keep
	p.cancel()
	if p.retry != nil {
		p.retry.Stop()
		p.retry = nil
	}
	if p.trimTimer != nil {
		p.trimTimer.Stop()
		p.trimTimer = nil
	}
	if p.lullTimer != nil {
		p.lullTimer.Stop()
		p.lullTimer = nil
	}
	var victims []*slot.Slot
	if !keep {
		for _, e := range p.idle {
			victims = append(victims, e.s)
		}
		p.idle = nil
	}
	p.broadcast()
	p.mu.Unlock()
	p.poke() // the retire loop finishes what is queued, then ends

	errs := []error{p.destroy(ctx, victims...)}
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("pool: close: waiting for in-flight work: %w", ctx.Err()))
	}
	p.mu.Lock()
	errs = append(errs, p.closeErrs...)
	p.closeErrs = nil
	var kept []*slot.Slot
	if keep {
		for _, e := range p.idle {
			kept = append(kept, e.s)
		}
		p.idle = nil
	}
	p.mu.Unlock()
	return kept, errors.Join(errs...)
}
