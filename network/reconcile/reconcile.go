package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/network/storage"
)

// DefaultInterval is the time between two passes.
const DefaultInterval = 30 * time.Second

// Options tune a Reconciler. The zero value is the default.
type Options struct {
	// Interval between passes (default DefaultInterval).
	Interval time.Duration
	// Teardown tunes each pass's teardown (workers, budget, orphans).
	// Deadline is taken as relative to the pass start when MaxPassTime is set.
	Teardown slot.TeardownOptions
	// MaxPassTime is a time budget per pass; the rest waits for the next
	// pass. 0 means none.
	MaxPassTime time.Duration
	// OnPass, if set, is called after each pass of Run.
	OnPass func(Pass)
}

// Pass reports one reconciliation pass.
type Pass struct {
	// Claimed are free indices on which stray resources were found; they
	// were quarantined before being torn down.
	Claimed []int
	// Freed are quarantined indices returned to the allocator.
	Freed []int
	// Teardown is what happened to the slots torn down (nil if none).
	Teardown *slot.TeardownResult
	// Err is the pass's error, if any (also returned by Once).
	Err error
}

// Reconciler owns no goroutine until Run is called; Run's goroutine is the
// caller's.
type Reconciler struct {
	m    *slot.Manager
	s    *storage.Storage
	opts Options
}

// New returns a reconciler for the slots of m and the indices of s.
func New(m *slot.Manager, s *storage.Storage, opts Options) *Reconciler {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	return &Reconciler{m: m, s: s, opts: opts}
}

// Run makes a pass at once and then every Interval until ctx ends; it
// returns nil when ctx ends. Errors of a pass are reported through OnPass
// and do not stop the loop.
func (r *Reconciler) Run(ctx context.Context) error {
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	for {
		p, _ := r.Once(ctx)
		if r.opts.OnPass != nil && ctx.Err() == nil {
			r.opts.OnPass(p)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Once makes one pass.
func (r *Reconciler) Once(ctx context.Context) (Pass, error) {
	var p Pass
	// Read before the scan: an index quarantined before it and absent from
	// it is clean (nothing makes resources for a quarantined index).
	before := r.s.Quarantined()
	inv, err := r.m.Scan(ctx)
	if err != nil {
		p.Err = fmt.Errorf("reconcile: scan: %w", err)
		return p, p.Err
	}
	targets := slot.Inventory{}
	for _, i := range inv.Indices() {
		st, err := r.s.State(i)
		if err != nil {
			continue
		}
		switch st {
		case storage.Quarantined:
			targets[i] = inv[i]
		case storage.Free:
			if r.s.QuarantineIfFree(i) {
				p.Claimed = append(p.Claimed, i)
				targets[i] = inv[i]
			}
		}
	}
	// Quarantined indices with nothing left on the host are free at once.
	var errs []error
	for _, i := range before {
		if _, ok := inv[i]; !ok {
			if err := r.s.Free(i); err == nil {
				p.Freed = append(p.Freed, i)
			}
		}
	}
	if len(targets) > 0 {
		opts := r.opts.Teardown
		if r.opts.MaxPassTime > 0 {
			opts.Deadline = time.Now().Add(r.opts.MaxPassTime)
		}
		res := r.m.Teardown(ctx, targets, opts)
		p.Teardown = res
		for _, i := range res.Reclaimed {
			if err := r.s.Free(i); err != nil {
				errs = append(errs, err)
				continue
			}
			p.Freed = append(p.Freed, i)
		}
		if err := res.Err(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		p.Err = fmt.Errorf("reconcile: %w", errors.Join(errs...))
	}
	return p, p.Err
}
