package pool

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/phasegate/phasegate/network/slot"
)

// fakeSlots stands in for the kernel: it records what exists.
type fakeSlots struct {
	mu       sync.Mutex
	live     map[int]bool
	created  []int
	batches  [][]int       // the indices of each Teardown call
	gate     chan struct{} // if non-nil, Create waits on it (or ctx)
	started  chan int      // if non-nil, Create reports its index here
	failNext int           // fail this many Creates
	// tdGate, if non-nil, holds every Teardown until it is closed;
	// tdStarted, if non-nil, gets the indices of each Teardown as it starts.
	tdGate    chan struct{}
	tdStarted chan []int
	failTd    map[int]bool // Teardown fails these indices
}

func newFake() *fakeSlots { return &fakeSlots{live: map[int]bool{}} }

func (f *fakeSlots) Create(ctx context.Context, i int) (*slot.Slot, error) {
	f.mu.Lock()
	gate, started := f.gate, f.started
	if f.failNext > 0 {
		f.failNext--
		f.mu.Unlock()
		return nil, errors.New("injected create failure")
	}
	f.live[i] = true // made "in the kernel" before the gate: Close must remove it
	f.created = append(f.created, i)
	f.mu.Unlock()
	if started != nil {
		started <- i
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	return &slot.Slot{Index: i}, nil
}

func (f *fakeSlots) Teardown(ctx context.Context, inv slot.Inventory, _ slot.TeardownOptions) *slot.TeardownResult {
	f.mu.Lock()
	gate, started := f.tdGate, f.tdStarted
	f.mu.Unlock()
	if started != nil {
		started <- inv.Indices()
	}
	if gate != nil {
		<-gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches = append(f.batches, inv.Indices())
	res := &slot.TeardownResult{}
	for _, i := range inv.Indices() {
		if f.failTd[i] {
			res.Failed = append(res.Failed, slot.Failure{Index: i, Err: errors.New("injected teardown failure")})
			continue
		}
		delete(f.live, i)
		res.Reclaimed = append(res.Reclaimed, i)
	}
	return res
}

// tornDown returns every index given to Teardown, in call order.
func (f *fakeSlots) tornDown() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Concat(f.batches...)
}

func (f *fakeSlots) createdCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.created)
}

func (f *fakeSlots) liveIndices() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int
	for i := range f.live {
		out = append(out, i)
	}
	slices.Sort(out)
	return out
}

type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	f       func()
	stopped bool
	fired   bool
}

func newClock() *fakeClock { return &fakeClock{now: time.Unix(1_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped && !t.fired
	t.stopped = true
	return was
}

// Advance moves time and runs the due timers synchronously.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	for _, t := range c.timers {
		if !t.stopped && !t.fired && !t.at.After(c.now) {
			t.fired = true
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	for _, t := range due {
		t.f()
	}
}

func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.stopped && !t.fired {
			n++
		}
	}
	return n
}

var _ Slots = (*slot.Manager)(nil)
