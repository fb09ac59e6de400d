package reconcile

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/slot"
)

// DefaultInterval is the time between two passes: a pass surveys the host
// in one read of each listing (tens of milliseconds for 10,000 slots:
// docs/BENCHMARKS.md), and a leased slot broken from outside is seen
// within it.
const DefaultInterval = 10 * time.Second

// Options tune a Reconciler. The zero value is the default.
type Options struct {
	// Interval between passes (default DefaultInterval).
	Interval time.Duration
	// Teardown tunes each pass's teardown (workers, budget, orphans,
	// batches). Deadline is taken as relative to the pass start when
	// MaxPassTime is set.
	Teardown slot.TeardownOptions
	// MaxPassTime is a time budget per pass; the rest waits for the next
	// pass. 0 means none.
	MaxPassTime time.Duration
	// OnPass, if set, is called after each pass of Run, failed ones
	// included, from Run's goroutine.
	OnPass func(Pass)
	// Keep, if set, names quarantined indices whose slots a pass must
	// never tear down, whatever it finds of them: slots that may belong to
	// somebody though no record says so (a start that lost its records
	// keeps the slots something lives in). Such an index is freed only once
	// nothing of it is left on the host.
	Keep func(index int) bool
}

// Pass reports one reconciliation pass. Everything a pass could not read
// or do is in it, by slot where there is one, for the caller to log and
// count (see the package doc).
type Pass struct {
	// Start is when the pass began; Duration how long it took.
	Start    time.Time
	Duration time.Duration
	// Claimed are free indices on which stray resources (or entries that
	// could not be inspected) were found; they were quarantined before
	// anything was torn down.
	Claimed []int
	// Freed are quarantined indices returned to the allocator.
	Freed []int
	// Beyond are indices greater than the configured slots that the pass
	// tore down (or tried to): slots a run with a larger Config.Slots left.
	Beyond []int
	// Failed are the slots the pass could not finish (teardown failures,
	// and indices the allocator refused to free). Those in range stay
	// quarantined; the next pass retries them all.
	Failed []slot.Failure
	// Unreadable are netns entries that could not be inspected. They are
	// never torn down, and their indices stay quarantined.
	Unreadable []slot.Unreadable
	// Teardown is what happened to the slots torn down (nil if none); its
	// ProcScan and WaitErr say what the teardown could not see.
	Teardown *slot.TeardownResult
	// Scan is the scan's error when the pass could not scan the host;
	// then nothing else was done.
	Scan error
	// Survey is what the pass's scan found, read after Start (nil when
	// Scan failed): the caller checks the slots it holds against it (the
	// pass never touches an acquired index), at no cost of another scan.
	Survey *slot.ScanResult
	// Err is nil when the pass did everything it set out to do; otherwise
	// it joins Scan, Failed and Unreadable (also returned by Once).
	Err error
}

// Indices is what a pass reads and changes of the slot indices:
// *index.Allocator implements it, and so does *pool.Pool, through which the
// daemon makes every index change (the pool owns its allocator).
type Indices interface {
	Quarantined() []int
	State(i int) (index.State, error)
	QuarantineIfFree(i int) bool
	Free(i int) error
}

// Reconciler owns no goroutine until Run is called; Run's goroutine is the
// caller's.
type Reconciler struct {
	m    *slot.Manager
	s    Indices
	opts Options

	mu      sync.Mutex
	last    Pass
	hasLast bool
}

// New returns a reconciler for the slots of m and the indices of s.
func New(m *slot.Manager, s Indices, opts Options) *Reconciler {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	return &Reconciler{m: m, s: s, opts: opts}
}

// Run makes a pass at once and then every Interval until ctx ends; it
// returns nil when ctx ends. A pass that fails does not stop the loop: it
// is reported through OnPass and Last.
func (r *Reconciler) Run(ctx context.Context) error {
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	for {
		p, _ := r.Once(ctx) // the error is p.Err
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

// Last returns the latest pass made by Run or Once, and false before the
// first.
func (r *Reconciler) Last() (Pass, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last, r.hasLast
}

// Once makes one pass. Its error is the pass's Err.
func (r *Reconciler) Once(ctx context.Context) (Pass, error) {
	p := r.once(ctx)
	p.Duration = time.Since(p.Start)
	r.mu.Lock()
	r.last, r.hasLast = p, true
	r.mu.Unlock()
	return p, p.Err
}

func (r *Reconciler) once(ctx context.Context) Pass {
	p := Pass{Start: time.Now()}
	n := r.m.Config().Slots
	// Read before the scan: an index quarantined before it and absent from
	// it is clean (nothing makes resources for a quarantined index).
	before := r.s.Quarantined()
	sr, err := r.m.Survey(ctx)
	if err != nil {
		p.Scan = fmt.Errorf("reconcile: scan: %w", err)
		p.Err = p.Scan
		return p
	}
	inv := sr.Inventory
	p.Survey = sr
	p.Unreadable = sr.Unreadable
	unreadable := map[int]bool{}
	for _, u := range sr.Unreadable {
		unreadable[u.Index] = true
		if u.Index <= n && r.s.QuarantineIfFree(u.Index) {
			p.Claimed = append(p.Claimed, u.Index)
		}
	}
	targets := slot.Inventory{}
	for _, i := range inv.Indices() {
		if i > n {
			targets[i] = inv[i]
			p.Beyond = append(p.Beyond, i)
			continue
		}
		st, err := r.s.State(i)
		if err != nil {
			p.Failed = append(p.Failed, slot.Failure{Index: i, Err: err})
			continue
		}
		switch st {
		case index.Quarantined:
			if r.opts.Keep != nil && r.opts.Keep(i) {
				continue
			}
			targets[i] = inv[i]
		case index.Free:
			if r.s.QuarantineIfFree(i) {
				p.Claimed = append(p.Claimed, i)
				targets[i] = inv[i]
			}
		}
	}
	// Quarantined indices with nothing left on the host are free at once.
	for _, i := range before {
		if _, ok := inv[i]; !ok && !unreadable[i] {
			p.free(r.s, i)
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
			if i <= n {
				p.free(r.s, i)
			}
		}
		p.Failed = append(p.Failed, res.Failed...)
	}
	var errs []error
	for _, f := range p.Failed {
		errs = append(errs, fmt.Errorf("slot %d: %w", f.Index, f.Err))
	}
	for _, u := range p.Unreadable {
		errs = append(errs, fmt.Errorf("slot %d: %w", u.Index, u.Err))
	}
	if len(errs) > 0 {
		p.Err = fmt.Errorf("reconcile: %w", errors.Join(errs...))
	}
	return p
}

// free returns i to the allocator, or records why it could not.
func (p *Pass) free(s Indices, i int) {
	if err := s.Free(i); err != nil {
		p.Failed = append(p.Failed, slot.Failure{Index: i, Err: err})
		return
	}
	p.Freed = append(p.Freed, i)
}
