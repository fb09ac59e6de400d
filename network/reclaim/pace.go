package reclaim

import (
	"fmt"
	"sync"
	"time"

	"github.com/phasegate/phasegate/network/slot"
)

// Signal is a wait the process measures and the most it should be while a
// reclaim runs: a health answer's, an Acquire's, a slot creation's.
type Signal struct {
	// Name names the wait in PaceStats.
	Name string
	// Target is the longest acceptable wait.
	Target time.Duration
	// Worst returns the longest wait seen since its previous call, 0 when
	// nothing waited. It is called once after each batch.
	Worst func() time.Duration
	// Waiting, if set, reports without taking anything whether this wait
	// has been observed since Worst's last call: somebody is waiting, or
	// asking, now. Pacer.Idle reads it; nil counts as nobody.
	Waiting func() bool
}

// PaceOptions configure a Pacer. Zero values take the defaults.
type PaceOptions struct {
	// Signals are the waits the pace answers to. With none, every batch
	// is four times the one before: as fast as the kernel allows.
	Signals []Signal
	// First is the first batch's size (default DefaultFirstBatch); Min
	// the smallest a batch gets (default DefaultMinBatch).
	First, Min int
	// MaxPause bounds the pause between batches (default
	// DefaultMaxPause). A pause is also never more than MaxPauseRatio
	// times the batch before it (default DefaultMaxPauseRatio), so the
	// reclaim keeps a share of the time however long the pressure lasts:
	// a wait the reclaim does not cause (a machine saturated by other
	// work) would otherwise stop it.
	MaxPause      time.Duration
	MaxPauseRatio int
}

// slowStartGrowth is how much a batch grows on the one before while no
// signal has been over its target yet. The kernel's clean-up of a batch
// has a fixed cost (its RCU grace periods) beside the per-namespace one,
// so the number of batches it takes to reach the kernel's rate is what
// the ramp costs (figures: docs/BENCHMARKS.md).
const slowStartGrowth = 4

// Defaults of PaceOptions.
const (
	DefaultFirstBatch = 64
	DefaultMinBatch   = 8
	DefaultMaxPause   = time.Second
	// DefaultMaxPauseRatio keeps the reclaim busy at least a fifth of the
	// time.
	DefaultMaxPauseRatio = 4
)

// Pacer paces a teardown's batches by what they do to the rest of the
// process, in the manner of TCP's congestion control: while no signal is
// over its target the batches quadruple (slow start) and, once a signal has
// been over, grow by First at a time (additive increase); when one is over
// its target, the next batch is half the size (multiplicative decrease)
// and is preceded by a pause as long as the batch just done, doubling while
// the pressure lasts (up to MaxPause, and MaxPauseRatio times the batch),
// so the others get at least half the time. Batches are what the kernel is handed at a time, and the kernel
// holds its networking lock while it destroys one, so a big batch is fast
// overall and long for a slot creation that waits on the lock.
//
// Its Pace method is a slot.TeardownOptions.Pace. A Pacer serves one
// teardown at a time; its Stats are safe to read meanwhile.
type Pacer struct {
	opts PaceOptions

	mu      sync.Mutex
	size    int
	ceiling int // the size at the last decrease: slow start stops there; 0: none yet
	pause   time.Duration
	stats   PaceStats
}

// PaceStats says what a Pacer did.
type PaceStats struct {
	// Batches is the number of batches paced; Slowed how many of them
	// were followed by a decrease, and Over counts those by signal.
	Batches, Slowed int
	Over            map[string]int
	// Largest is the largest batch size the pacer asked for.
	Largest int
	// Paused is the sum of the pauses it asked for.
	Paused time.Duration
}

// NewPacer returns a pacer with opts.
func NewPacer(opts PaceOptions) (*Pacer, error) {
	if opts.First < 0 || opts.Min < 0 || opts.MaxPause < 0 || opts.MaxPauseRatio < 0 {
		return nil, fmt.Errorf("reclaim: negative pace option in %+v", opts)
	}
	for _, s := range opts.Signals {
		if s.Target <= 0 || s.Worst == nil {
			return nil, fmt.Errorf("reclaim: signal %q needs a positive target and a Worst function", s.Name)
		}
	}
	if opts.First == 0 {
		opts.First = DefaultFirstBatch
	}
	if opts.Min == 0 {
		opts.Min = DefaultMinBatch
	}
	opts.Min = min(opts.Min, opts.First)
	if opts.MaxPause == 0 {
		opts.MaxPause = DefaultMaxPause
	}
	if opts.MaxPauseRatio == 0 {
		opts.MaxPauseRatio = DefaultMaxPauseRatio
	}
	return &Pacer{opts: opts, size: opts.First, stats: PaceStats{Over: map[string]int{}, Largest: opts.First}}, nil
}

// Idle reports whether no signal has anything waiting (Signal.Waiting):
// a teardown's next batch may then overlap the one the kernel is still
// destroying (slot.TeardownOptions.Overlap), as fast as the kernel allows.
func (p *Pacer) Idle() bool {
	for _, s := range p.opts.Signals {
		if s.Waiting != nil && s.Waiting() {
			return false
		}
	}
	return true
}

// First returns the size of the first batch.
func (p *Pacer) First() int { return p.opts.First }

// Pace returns the next batch's size and the pause before it, after the
// batch last.
func (p *Pacer) Pace(last slot.BatchDone) (next int, pause time.Duration) {
	var over []string
	for _, s := range p.opts.Signals {
		if s.Worst() > s.Target {
			over = append(over, s.Name)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Batches++
	if len(over) > 0 {
		p.stats.Slowed++
		for _, name := range over {
			p.stats.Over[name]++
		}
		p.ceiling = max(p.size/2, p.opts.Min)
		p.size = p.ceiling
		p.pause = min(max(2*p.pause, last.Took), p.opts.MaxPause, time.Duration(p.opts.MaxPauseRatio)*last.Took)
	} else {
		p.pause = 0
		if p.ceiling == 0 {
			p.size *= slowStartGrowth
		} else {
			p.size += p.opts.First
		}
	}
	if last.Left > 0 {
		p.size = min(p.size, max(last.Left, p.opts.Min))
	}
	p.stats.Largest = max(p.stats.Largest, p.size)
	p.stats.Paused += p.pause
	return p.size, p.pause
}

// Stats returns what the pacer did so far.
func (p *Pacer) Stats() PaceStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Over = make(map[string]int, len(p.stats.Over))
	for k, v := range p.stats.Over {
		s.Over[k] = v
	}
	return s
}
