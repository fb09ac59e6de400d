package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/slot"
)

// Defaults of Options.
const (
	// DefaultGrace is how long an idle slot above target is kept.
	DefaultGrace = 5 * time.Minute
	// DefaultFillConcurrency bounds concurrent background creations.
	DefaultFillConcurrency = 2
	// DefaultMinBackoff is the first wait after a failed fill.
	DefaultMinBackoff = 100 * time.Millisecond
	// DefaultMaxBackoff caps the wait after repeated failed fills.
	DefaultMaxBackoff = 30 * time.Second
	// DefaultLull is how long Gets must pause before the background fill
	// makes slots while the pool still holds its reserve: about two slot
	// creations on a busy node (docs/BENCHMARKS.md, "Figures behind the
	// network code"; the runs: docs/BENCHMARKS-HISTORY.md, "The refill
	// waits for a lull"), so that Gets further apart than that interleave
	// with the fill and only a burst defers it.
	DefaultLull = 10 * time.Millisecond
)

// Errors callers branch on.
var (
	// ErrClosed: the pool is closed.
	ErrClosed = errors.New("pool: closed")
	// ErrNotFromPool: Put of a slot this pool did not hand out (or twice).
	ErrNotFromPool = errors.New("pool: slot not handed out by this pool")
)

// Slots is the kernel side the pool drives; *slot.Manager implements it.
type Slots interface {
	Create(ctx context.Context, index int) (*slot.Slot, error)
	Teardown(ctx context.Context, inv slot.Inventory, opts slot.TeardownOptions) *slot.TeardownResult
}

// Timer is a stoppable timer.
type Timer interface {
	Stop() bool
}

// Clock lets tests control time. The default uses package time.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d.
	AfterFunc(d time.Duration, f func()) Timer
}

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Options configure a Pool. A zero Target or Grace means zero; the other
// fields have no meaningful zero and take their defaults when zero.
type Options struct {
	// Target is the number of idle slots the pool keeps warm. Zero keeps
	// none: every Get creates a slot, and returned slots are kept only for
	// the grace period.
	Target int
	// FillConcurrency bounds concurrent background creations; 0 means
	// DefaultFillConcurrency (a pool that never fills has Target 0).
	FillConcurrency int
	// Grace is how long an idle slot above target is kept before being
	// destroyed. Zero destroys slots above target as soon as they are
	// idle; the daemon's default is DefaultGrace.
	Grace time.Duration
	// MinBackoff and MaxBackoff bound the wait after a failed fill; 0 means
	// DefaultMinBackoff and DefaultMaxBackoff (no wait at all would retry a
	// failing kernel in a busy loop).
	MinBackoff, MaxBackoff time.Duration
	// Lull is how long Gets must pause before the background fill makes
	// slots again while the pool holds at least its reserve (a quarter of
	// Target, rounded up): a burst of Gets is served from warm slots
	// without the fill's kernel work competing with it for the CPU and the
	// kernel's networking lock, and the pool refills once the burst is
	// over; a burst that drains it below the reserve has it refilled to the
	// reserve at once, the rest after the lull. 0 means
	// DefaultLull; a negative Lull refills after every Get. Replacements of
	// slots given back with Put and Gets on an empty pool never wait.
	Lull time.Duration
	// Teardown tunes how slots are destroyed, released ones included
	// (KillOrphans decides what happens to a process a tenant left
	// running: killed, or cut off with its namespace).
	Teardown slot.TeardownOptions
	// Clock is for tests (default: real time).
	Clock Clock

	// Idle are slots made earlier (adopted at a restart) that start on the
	// idle stack, the last one on top; InUse are slots handed out earlier
	// (restored leases), so that Put takes them back. Their indices must be
	// acquired in the allocator already.
	Idle, InUse []*slot.Slot
	// Lost are the indices of leases whose slot was gone at a restart:
	// acquired in the allocator already, with no slot; PutLost gives each
	// back when its lease ends.
	Lost []int
	// OnIdle, when set, is called with every slot before it goes on the
	// idle stack: one a fill or a replacement made, and one given back by
	// Return that was made for a Get on an empty pool. A slot made for
	// such a Get goes to its caller without it: the caller's own record
	// is the slot's first. A slot Return gives back that a Get took from
	// the idle stack went through OnIdle already, unchanged since: it goes
	// back without a second call, so that a caller whose own record failed
	// (a full filesystem) never drains the pool. An error destroys the
	// slot (for a made one, a failed creation). The daemon records the
	// slot there, once, so that a restart adopts it.
	OnIdle func(ctx context.Context, s *slot.Slot) error
	// OnGone, when set, is called with the indices of slots the pool tore
	// down (a trim, Close, a failed creation, a Put), whatever the
	// teardown's outcome: the slots are no longer the pool's. It is not
	// called for slots Stop keeps.
	OnGone func(indices []int)
	// OnOrphans, when set, is called after a teardown of the pool's with
	// the processes it found inside the slots' namespaces (a tenant's left
	// running in a slot given back with Put, Retire or Discard), which
	// Teardown.KillOrphans killed or which were cut off with their
	// namespace.
	OnOrphans func(orphans []slot.Orphan)
}

type idleSlot struct {
	s     *slot.Slot
	since time.Time
}

// Pool is a LIFO pool of warm slots. Create one with New; it is safe for
// concurrent use.
//
// The pool is the one owner of the allocator it is given: every change of
// an index goes through it (its own slots, a lost lease's index with
// PutLost, a quarantined index freed with Free and the reconciler's claims
// with QuarantineIfFree), so that no index changes state behind the
// pool's back.
type Pool struct {
	slots Slots
	idx   *index.Allocator
	opts  Options

	ctx    context.Context // cancelled by Close: aborts creations
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine and every in-flight Get/Put/destroy

	wake chan struct{} // 1-buffered: the retire loop has work (or the pool closed)

	mu       sync.Mutex
	idle     []idleSlot // stack: oldest at 0, next Get at the end
	inUse    map[int]*slot.Slot
	fromIdle map[int]bool // handed out from the idle stack: through OnIdle already
	lost     map[int]bool // indices of lost leases, until PutLost
	creating map[int]bool
	retireQ  []*retirement // given back, not yet taken by the retire loop
	retiring map[int]bool  // given back, until their teardown is over
	filling  int
	// exhausted: the fill found no free index (every one handed out, lost
	// or quarantined: a full node). It waits for one to come back
	// (indexBack) rather than back off: that is no failure.
	exhausted bool
	closed    bool
	keep      bool          // closed by Stop: slots made from now on are kept, not destroyed
	changed   chan struct{} // closed and replaced on every change
	backoff   time.Duration
	retry     Timer
	trimTimer Timer
	lastGet   time.Time // the last Get that took an idle slot
	lullTimer Timer     // kicks the fill once the Gets have paused for Lull
	lastErr   error
	closeErrs []error
}

// New starts a pool that fills itself to opts.Target in the background,
// taking its indices from idx, which it owns from now on.
func New(slots Slots, idx *index.Allocator, opts Options) (*Pool, error) {
	if opts.Target < 0 {
		return nil, fmt.Errorf("pool: negative target %d", opts.Target)
	}
	if opts.FillConcurrency == 0 {
		opts.FillConcurrency = DefaultFillConcurrency
	}
	if opts.Grace < 0 {
		return nil, fmt.Errorf("pool: negative grace %v", opts.Grace)
	}
	if opts.FillConcurrency < 0 || opts.MinBackoff < 0 || opts.MaxBackoff < 0 {
		return nil, fmt.Errorf("pool: negative option in %+v", opts)
	}
	if opts.MinBackoff == 0 {
		opts.MinBackoff = DefaultMinBackoff
	}
	if opts.Lull == 0 {
		opts.Lull = DefaultLull
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = DefaultMaxBackoff
	}
	opts.MaxBackoff = max(opts.MaxBackoff, opts.MinBackoff)
	if opts.Clock == nil {
		opts.Clock = realClock{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{
		slots: slots, idx: idx, opts: opts, ctx: ctx, cancel: cancel,
		inUse: map[int]*slot.Slot{}, fromIdle: map[int]bool{}, lost: map[int]bool{}, creating: map[int]bool{}, retiring: map[int]bool{},
		wake: make(chan struct{}, 1), changed: make(chan struct{}), backoff: opts.MinBackoff,
	}
	now := opts.Clock.Now()
	for _, s := range opts.Idle {
		p.idle = append(p.idle, idleSlot{s: s, since: now})
	}
	for _, s := range opts.InUse {
		p.inUse[s.Index] = s
	}
	for _, i := range opts.Lost {
		p.lost[i] = true
	}
	opts.Idle, opts.InUse, opts.Lost = nil, nil, nil // not kept: the pool owns them now
	p.opts = opts
	p.wg.Add(1)
	go p.retireLoop()
	p.mu.Lock()
	p.kick()
	p.scheduleTrim()
	p.mu.Unlock()
	return p, nil
}

// broadcast wakes WaitReady callers and those of Changed. Call with p.mu
// held.
func (p *Pool) broadcast() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Changed returns a channel closed at the pool's next change (a slot made,
// handed out, given back or torn down, a fill that failed or found no
// free index): for a caller that follows the pool's Level.
func (p *Pool) Changed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// indexBack resumes a fill that stopped for want of a free index, now that
// one has come back. Call with p.mu held.
func (p *Pool) indexBack() {
	if p.exhausted {
		p.exhausted = false
		p.kick()
		p.broadcast()
	}
}

func (p *Pool) addCloseErr(err error) {
	if err == nil {
		return
	}
	p.mu.Lock()
	p.closeErrs = append(p.closeErrs, err)
	p.mu.Unlock()
}

// create acquires an index and makes its slot, for the idle stack (idle:
// OnIdle is called) or for a Get. On failure the index is released (or
// quarantined if the slot could not be cleaned).
func (p *Pool) create(ctx context.Context, idle bool) (*slot.Slot, error) {
	i, err := p.idx.Acquire()
	if err != nil {
		return nil, fmt.Errorf("pool: acquire index: %w", err)
	}
	p.mu.Lock()
	p.creating[i] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.creating, i)
		p.mu.Unlock()
	}()
	s, err := p.slots.Create(ctx, i)
	if err == nil && idle && p.opts.OnIdle != nil {
		if err = p.opts.OnIdle(ctx, s); err != nil {
			err = fmt.Errorf("record: %w", err)
		}
	}
	if err != nil {
		// Create cleans up after itself; make sure, and keep the index
		// only if nothing is left.
		if derr := p.destroyIndices(context.WithoutCancel(ctx), []int{i}); derr != nil {
			return nil, errors.Join(fmt.Errorf("pool: create slot %d: %w", i, err), derr)
		}
		return nil, fmt.Errorf("pool: create slot %d: %w", i, err)
	}
	return s, nil
}

// destroy tears a slot down and gives its index back (or quarantines it).
func (p *Pool) destroy(ctx context.Context, ss ...*slot.Slot) error {
	return p.destroyInventory(ctx, slot.AssumeOf(ss...))
}

// destroyIndices is destroy of the slots at idx, with what Assume assumes.
func (p *Pool) destroyIndices(ctx context.Context, idx []int) error {
	return p.destroyInventory(ctx, slot.Assume(idx...))
}

func (p *Pool) destroyInventory(ctx context.Context, inv slot.Inventory) error {
	if len(inv) == 0 {
		return nil
	}
	idx := slices.Sorted(maps.Keys(inv))
	res := p.slots.Teardown(ctx, inv, p.opts.Teardown)
	p.gone(idx, res)
	var errs []error
	for _, i := range res.Reclaimed {
		if err := p.idx.Release(i); err != nil {
			errs = append(errs, err)
		}
	}
	if len(res.Reclaimed) > 0 {
		p.mu.Lock()
		p.indexBack()
		p.mu.Unlock()
	}
	for _, i := range append(res.FailedIndices(), res.Deferred...) {
		if err := p.idx.Quarantine(i); err != nil {
			errs = append(errs, err)
		}
	}
	if err := res.Err(); err != nil {
		errs = append(errs, fmt.Errorf("pool: destroy: %w", err))
	}
	if len(res.Deferred) > 0 {
		errs = append(errs, fmt.Errorf("pool: destroy: %d slot(s) not started: %w", len(res.Deferred), context.Cause(ctx)))
	}
	return errors.Join(errs...)
}

// gone reports torn-down indices to OnGone, and the processes their
// teardown res found inside to OnOrphans.
func (p *Pool) gone(indices []int, res *slot.TeardownResult) {
	if p.opts.OnGone != nil && len(indices) > 0 {
		p.opts.OnGone(indices)
	}
	if p.opts.OnOrphans != nil && res != nil && len(res.Orphans) > 0 {
		p.opts.OnOrphans(res.Orphans)
	}
}
