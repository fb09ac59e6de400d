package pool

import (
	"context"
	"errors"
	"fmt"
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
	// creations on a busy node (docs/BENCHMARKS.md, "The refill waits for
	// a lull"), so that Gets further apart than that interleave with the
	// fill and only a burst defers it.
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
	// OnMade, when set, is called with every slot the pool makes (a fill,
	// a replacement, a Get on an empty pool) before anyone can have it;
	// an error destroys the slot and counts as a failed creation. The
	// daemon records the slot there.
	OnMade func(ctx context.Context, s *slot.Slot) error
	// OnGone, when set, is called with the indices of slots the pool tore
	// down (a trim, Close, a failed creation, a Put), whatever the
	// teardown's outcome: the slots are no longer the pool's. It is not
	// called for slots Stop keeps.
	OnGone func(indices []int)
}

type idleSlot struct {
	s     *slot.Slot
	since time.Time
}

// retirement is a slot given back with Put, waiting to be torn down.
type retirement struct {
	s    *slot.Slot
	done chan error // 1-buffered: the teardown's outcome for this slot
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

	mu        sync.Mutex
	idle      []idleSlot // stack: oldest at 0, next Get at the end
	inUse     map[int]*slot.Slot
	lost      map[int]bool // indices of lost leases, until PutLost
	creating  map[int]bool
	retireQ   []*retirement // given back, not yet taken by the retire loop
	retiring  map[int]bool  // given back, until their teardown is over
	filling   int
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
		inUse: map[int]*slot.Slot{}, lost: map[int]bool{}, creating: map[int]bool{}, retiring: map[int]bool{},
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

// broadcast wakes WaitReady callers. Call with p.mu held.
func (p *Pool) broadcast() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// kick starts fill workers while the pool is below target. Call with p.mu
// held.
func (p *Pool) kick() {
	if p.waitForLull() {
		return
	}
	for !p.closed && p.retry == nil && p.filling < p.opts.FillConcurrency &&
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
// arms the fill's backoff.
func (p *Pool) makeIdle() {
	s, err := p.create(p.ctx)
	p.mu.Lock()
	p.filling--
	if err != nil {
		p.lastErr = err
		if p.retry == nil && !p.closed {
			d := p.backoff
			p.backoff = min(2*p.backoff, p.opts.MaxBackoff)
			p.retry = p.opts.Clock.AfterFunc(d, func() {
				p.mu.Lock()
				defer p.mu.Unlock()
				p.retry = nil
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

func (p *Pool) addCloseErr(err error) {
	if err == nil {
		return
	}
	p.mu.Lock()
	p.closeErrs = append(p.closeErrs, err)
	p.mu.Unlock()
}

// create acquires an index and makes its slot. On failure the index is
// released (or quarantined if the slot could not be cleaned).
func (p *Pool) create(ctx context.Context) (*slot.Slot, error) {
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
	if err == nil && p.opts.OnMade != nil {
		if err = p.opts.OnMade(ctx, s); err != nil {
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
	idx := make([]int, 0, len(ss))
	for _, s := range ss {
		idx = append(idx, s.Index)
	}
	return p.destroyIndices(ctx, idx)
}

func (p *Pool) destroyIndices(ctx context.Context, idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	res := p.slots.Teardown(ctx, slot.Assume(idx...), p.opts.Teardown)
	p.gone(idx)
	var errs []error
	for _, i := range res.Reclaimed {
		if err := p.idx.Release(i); err != nil {
			errs = append(errs, err)
		}
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

// Get returns the most recently returned idle slot, or creates one when the
// pool is empty. It fails with ErrClosed after Close.
func (p *Pool) Get(ctx context.Context) (*slot.Slot, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	if n := len(p.idle); n > 0 {
		e := p.idle[n-1]
		p.idle[n-1] = idleSlot{}
		p.idle = p.idle[:n-1]
		p.inUse[e.s.Index] = e.s
		p.lastGet = p.opts.Clock.Now()
		p.kick()
		p.broadcast()
		p.mu.Unlock()
		return e.s, nil
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
	s, err := p.create(cctx)
	if err != nil {
		if p.ctx.Err() != nil {
			return nil, errors.Join(ErrClosed, err)
		}
		return nil, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.Join(ErrClosed, p.destroy(context.WithoutCancel(ctx), s))
	}
	p.inUse[s.Index] = s
	p.mu.Unlock()
	return s, nil
}

// Return puts a slot handed out by Get back on top of the idle stack as it
// is: for a caller that could not hand it on (its own record failed, its
// client left), so no tenant ever had it. After Close or Stop the slot is
// destroyed, or kept with the idle ones by Stop.
func (p *Pool) Return(s *slot.Slot) error {
	if s == nil {
		return fmt.Errorf("%w: nil slot", ErrNotFromPool)
	}
	p.mu.Lock()
	if p.inUse[s.Index] != s {
		p.mu.Unlock()
		return fmt.Errorf("%w: slot %d", ErrNotFromPool, s.Index)
	}
	delete(p.inUse, s.Index)
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
	if s == nil {
		return fmt.Errorf("%w: nil slot", ErrNotFromPool)
	}
	p.mu.Lock()
	if p.inUse[s.Index] != s {
		p.mu.Unlock()
		return fmt.Errorf("%w: slot %d", ErrNotFromPool, s.Index)
	}
	delete(p.inUse, s.Index)
	if p.closed {
		p.mu.Unlock()
		return p.destroy(context.WithoutCancel(ctx), s)
	}
	r := &retirement{s: s, done: make(chan error, 1)}
	p.retireQ = append(p.retireQ, r)
	p.retiring[s.Index] = true
	p.mu.Unlock()
	p.poke()
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("pool: put slot %d: %w (its teardown goes on)", s.Index, ctx.Err())
	}
}

// PutLost gives back the index of a lost lease (Options.Lost, or Lose) once the
// lease has ended: nothing of its slot is left on the host, so the index is
// free at once. An index the pool was not given as lost (or given back
// already) fails with ErrNotFromPool. It works after Close too: it only
// changes the allocator.
func (p *Pool) PutLost(i int) error {
	p.mu.Lock()
	if !p.lost[i] {
		p.mu.Unlock()
		return fmt.Errorf("%w: %d is not a lost lease's index", ErrNotFromPool, i)
	}
	delete(p.lost, i)
	p.mu.Unlock()
	if err := p.idx.Release(i); err != nil {
		return fmt.Errorf("pool: give back lost index %d: %w", i, err)
	}
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
	p.lost[s.Index] = true
	p.broadcast()
	return nil
}

// Free returns a quarantined index to the free ones once its slot is gone,
// torn down by someone else than the pool: the background reclaim of the
// dead slots, the reconciler. It does not wake the fill (a fill that found
// no free index retries after its backoff).
func (p *Pool) Free(i int) error {
	return p.idx.Free(i)
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
// makes a fresh slot for each slot torn down (FillConcurrency at a time),
// and then reports to each Put.
func (p *Pool) retire(batch []*retirement) {
	idx := make([]int, 0, len(batch))
	for _, r := range batch {
		idx = append(idx, r.s.Index)
	}
	// Not p.ctx: Close waits for the teardown rather than aborting it.
	res := p.slots.Teardown(context.Background(), slot.Assume(idx...), p.opts.Teardown)
	p.gone(idx)
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
	p.filling += replace // counted toward the target: kick makes no extra
	p.broadcast()
	p.mu.Unlock()
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
		r.done <- errs[r.s.Index]
	}
}

// gone reports torn-down indices to OnGone.
func (p *Pool) gone(indices []int) {
	if p.opts.OnGone != nil && len(indices) > 0 {
		p.opts.OnGone(indices)
	}
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
// then kept, OnMade having recorded them), slots given back are torn down,
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

// Snapshot is a consistent view of the pool for an API that lists slots.
type Snapshot struct {
	// Target is the configured number of warm slots.
	Target int
	// Idle are the warm slots' indices, next Get first.
	Idle []int
	// InUse are the indices handed out and not yet returned, ascending.
	InUse []int
	// Creating are the indices being created, ascending.
	Creating []int
	// Retiring are the indices given back with Put whose teardown is not
	// over yet, ascending.
	Retiring []int
	// Filling is the number of background creations under way (their
	// index may not be acquired yet, so Creating can be shorter).
	Filling int
	// WaitingForLull: the pool is below target and its fill waits for the
	// Gets to pause (Options.Lull).
	WaitingForLull bool
	// Closed is true after Close.
	Closed bool
	// LastError is the last fill or trim error (nil if none).
	LastError error
}

// Snapshot returns the pool's current state.
func (p *Pool) Snapshot() Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Snapshot{Target: p.opts.Target, Closed: p.closed, LastError: p.lastErr, Filling: p.filling, WaitingForLull: p.lullTimer != nil}
	for k := len(p.idle) - 1; k >= 0; k-- {
		s.Idle = append(s.Idle, p.idle[k].s.Index)
	}
	for i := range p.inUse {
		s.InUse = append(s.InUse, i)
	}
	for i := range p.creating {
		s.Creating = append(s.Creating, i)
	}
	for i := range p.retiring {
		s.Retiring = append(s.Retiring, i)
	}
	slices.Sort(s.InUse)
	slices.Sort(s.Creating)
	slices.Sort(s.Retiring)
	return s
}
