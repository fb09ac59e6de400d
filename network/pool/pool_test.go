package pool

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/slot"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func newPool(t *testing.T, f *fakeSlots, n int, opts Options) (*Pool, *index.Allocator) {
	t.Helper()
	st, err := index.New(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(f, st, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p, st
}

// waitRest waits until the pool makes and tears down nothing, and waits
// for no lull to make more.
func waitRest(t *testing.T, p *Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := p.Snapshot()
		if s.Filling == 0 && len(s.Creating) == 0 && len(s.Retiring) == 0 && !s.WaitingForLull {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool never came to rest: %+v", s)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestLIFOAndOnDemand(t *testing.T) {
	f := newFake()
	p, st := newPool(t, f, 10, Options{Target: 3, Grace: time.Hour})
	ctx := context.Background()
	if err := p.WaitReady(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitReady(ctx, 4); err == nil {
		t.Errorf("WaitReady above target accepted")
	}
	var got []*slot.Slot
	for range 3 {
		s, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	// Give two back: each is torn down and replaced by a fresh slot on top
	// of the idle stack. (The refill to target first: a replacement landing
	// while it runs would count toward the target, like a slot given back
	// always did.)
	waitRest(t, p)
	if err := p.Put(ctx, got[0]); err != nil {
		t.Fatal(err)
	}
	if err := p.Put(ctx, got[1]); err != nil {
		t.Fatal(err)
	}
	if err := p.Put(ctx, got[1]); !errors.Is(err, ErrNotFromPool) {
		t.Errorf("double Put = %v", err)
	}
	if err := p.Put(ctx, &slot.Slot{Index: 9}); !errors.Is(err, ErrNotFromPool) {
		t.Errorf("foreign Put = %v", err)
	}
	if torn := f.tornDown(); !slices.Equal(torn, []int{got[0].Index, got[1].Index}) {
		t.Errorf("torn down = %v, want %d %d", torn, got[0].Index, got[1].Index)
	}
	waitRest(t, p)
	snap := p.Snapshot()
	if len(snap.Idle) != 5 {
		t.Errorf("idle = %v, want target 3 + 2 replacements", snap.Idle)
	}
	top := snap.Idle[0]
	s, err := p.Get(ctx)
	if err != nil || s.Index != top {
		t.Fatalf("Get = %v, %v; want top %d", s, err, top)
	}
	for _, g := range got {
		if s == g {
			t.Errorf("Get handed out a slot given back (%d) instead of a fresh one", g.Index)
		}
	}

	// Empty pool and no fill (target 0): Get creates on demand.
	f2 := newFake()
	p2, _ := newPool(t, f2, 4, Options{Target: 0})
	s2, err := p2.Get(ctx)
	if err != nil || s2 == nil {
		t.Fatalf("on-demand Get = %v, %v", s2, err)
	}
	if snap := p2.Snapshot(); !slices.Equal(snap.InUse, []int{s2.Index}) || len(snap.Idle) != 0 {
		t.Errorf("snapshot = %+v", snap)
	}
	if err := p2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p2.Put(ctx, s2); err != nil {
		t.Errorf("Put after Close = %v", err)
	}
	if live := f2.liveIndices(); len(live) != 0 {
		t.Errorf("live after Close+Put: %v", live)
	}

	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	_ = st
}

// The background fill waits while Gets keep coming, until they pause for
// Lull; a burst that takes the pool below its reserve is refilled to the
// reserve at once.
func TestFillWaitsForLull(t *testing.T) {
	const lull = 10 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFake()
	clk := newClock()
	p, _ := newPool(t, f, 32, Options{Target: 8, Grace: time.Hour, Lull: lull, Clock: clk})
	get := func(n int) {
		t.Helper()
		for range n {
			if _, err := p.Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := func(step string, idle, created int, waiting bool) {
		t.Helper()
		wantFill(t, p, f, step, idle, created, waiting)
	}
	if err := p.WaitReady(ctx, 8); err != nil {
		t.Fatal(err)
	}
	want("filled", 8, 8, false)

	get(3)
	want("a burst of 3", 5, 8, true)
	clk.Advance(lull - time.Millisecond)
	get(1)
	want("a Get before the lull", 4, 8, true)
	clk.Advance(lull - time.Millisecond) // the first timer fires: the last Get moved the lull
	want("the lull moved by the last Get", 4, 8, true)
	clk.Advance(time.Millisecond)
	if err := p.WaitReady(ctx, 8); err != nil {
		t.Fatal(err)
	}
	want("after the lull", 8, 12, false)

	// Below the reserve (a quarter of 8) the fill makes slots at once, up
	// to the reserve; the rest waits for the lull.
	get(7)
	if err := p.WaitReady(ctx, 2); err != nil {
		t.Fatalf("below the reserve, no refill without a lull: %v", err)
	}
	want("refilled to the reserve", 3, 14, true) // both fill workers started below it
	clk.Advance(lull)
	if err := p.WaitReady(ctx, 8); err != nil {
		t.Fatal(err)
	}
	want("after the burst's lull", 8, 19, false)
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if clk.pending() != 0 {
		t.Errorf("timers left after Close: %d", clk.pending())
	}

	// A negative Lull refills after every Get.
	f2 := newFake()
	p2, _ := newPool(t, f2, 8, Options{Target: 4, Grace: time.Hour, Lull: -1, Clock: newClock()})
	if err := p2.WaitReady(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p2.WaitReady(ctx, 4); err != nil {
		t.Fatalf("Lull -1: no refill after a Get: %v", err)
	}
	if err := p2.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// wantFill waits for p's fill to finish (the fake's creations take no
// time) and checks, at step, the idle slots, the slots f created and
// whether the fill waits for a lull.
func wantFill(t *testing.T, p *Pool, f *fakeSlots, step string, idle, created int, waiting bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	s := p.Snapshot()
	for ; s.Filling > 0; s = p.Snapshot() { // the fake's creations take no time
		if time.Now().After(deadline) {
			t.Fatalf("%s: the fill never finished: %+v", step, s)
		}
		time.Sleep(time.Millisecond)
	}
	if len(s.Idle) != idle || f.createdCount() != created || s.WaitingForLull != waiting {
		t.Fatalf("%s: idle %d, created %d, waiting for a lull %v; want %d, %d, %v",
			step, len(s.Idle), f.createdCount(), s.WaitingForLull, idle, created, waiting)
	}
}

// Strict LIFO without a background fill in the way.
func TestLIFOOrder(t *testing.T) {
	f := newFake()
	p, _ := newPool(t, f, 10, Options{Target: 0, Grace: time.Hour, FillConcurrency: 1, Clock: newClock()})
	ctx := context.Background()
	var ss []*slot.Slot
	for range 4 {
		s, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	for _, k := range []int{2, 0, 3, 1} {
		if err := p.Put(ctx, ss[k]); err != nil {
			t.Fatal(err)
		}
		waitRest(t, p) // replacements land in Put order
	}
	// The allocator hands out the index freed last, so each replacement
	// has the index of the slot it replaces; the last made is on top.
	want := []int{ss[1].Index, ss[3].Index, ss[0].Index, ss[2].Index}
	if got := p.Snapshot().Idle; !slices.Equal(got, want) {
		t.Errorf("idle order = %v, want %v", got, want)
	}
	for _, w := range want {
		s, _ := p.Get(ctx)
		if s.Index != w {
			t.Errorf("Get = %d, want %d", s.Index, w)
		}
		if err := p.Put(ctx, s); err != nil { // replaced, on top
			t.Fatal(err)
		}
		waitRest(t, p)
		s2, _ := p.Get(ctx)
		if s2 == s || s2.Index != s.Index {
			t.Errorf("Get after Put returned %p (%d), want a fresh slot at %d", s2, s2.Index, s.Index)
		}
	}
	_ = p.Close(ctx)
}

func TestTrimAfterGrace(t *testing.T) {
	f := newFake()
	clk := newClock()
	p, st := newPool(t, f, 10, Options{Target: 1, Grace: 5 * time.Minute, Clock: clk})
	ctx := context.Background()
	if err := p.WaitReady(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// Take 4 (1 warm + 3 on demand), then wait for the refill to 1.
	var ss []*slot.Slot
	for range 4 {
		s, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	if err := p.WaitReady(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// Return them a minute apart: idle = 1 warm + 4 replacements, target 1.
	for _, s := range ss {
		if err := p.Put(ctx, s); err != nil {
			t.Fatal(err)
		}
		waitRest(t, p)
		clk.Advance(time.Minute)
	}
	if n := len(p.Snapshot().Idle); n != 5 {
		t.Fatalf("idle = %d, want 5", n)
	}
	// The warm one (refilled before the Puts) and ss[0] are idle since t0.
	clk.Advance(30 * time.Second) // t0+4.5 min: nothing is due yet
	if idle := p.Snapshot().Idle; len(idle) != 5 {
		t.Fatalf("after 4.5 min idle = %v, want all 5", idle)
	}
	clk.Advance(time.Minute) // t0+5.5 min: the two oldest go
	idle := p.Snapshot().Idle
	if !slices.Equal(idle, []int{ss[3].Index, ss[2].Index, ss[1].Index}) {
		t.Fatalf("idle = %v, want %d %d %d", idle, ss[3].Index, ss[2].Index, ss[1].Index)
	}
	clk.Advance(10 * time.Minute)
	idle = p.Snapshot().Idle
	if !slices.Equal(idle, []int{ss[3].Index}) {
		t.Fatalf("idle = %v, want only the newest %d", idle, ss[3].Index)
	}
	if live := f.liveIndices(); !slices.Equal(live, []int{ss[3].Index}) {
		t.Errorf("live = %v", live)
	}
	if snap := st.Snapshot(); snap.Acquired != 1 || snap.Free != 9 {
		t.Errorf("allocator = %+v", snap)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if clk.pending() != 0 {
		t.Errorf("timers left after Close: %d", clk.pending())
	}
}

func TestCloseDuringFill(t *testing.T) {
	f := newFake()
	f.gate = make(chan struct{}) // creations hang until cancelled
	f.started = make(chan int, 10)
	p, st := newPool(t, f, 10, Options{Target: 4, FillConcurrency: 2})
	<-f.started
	<-f.started
	if c := p.Snapshot().Creating; len(c) != 2 {
		t.Errorf("creating = %v", c)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if live := f.liveIndices(); len(live) != 0 {
		t.Errorf("slots left after Close: %v", live)
	}
	if snap := st.Snapshot(); snap.Free != 10 {
		t.Errorf("allocator after Close: %+v", snap)
	}
	if _, err := p.Get(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close = %v", err)
	}
	if err := p.WaitReady(context.Background(), 1); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitReady after Close = %v", err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

func TestFillBackoff(t *testing.T) {
	f := newFake()
	f.failNext = 3
	clk := newClock()
	p, _ := newPool(t, f, 10, Options{Target: 2, FillConcurrency: 1, Clock: clk, MinBackoff: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.WaitReady(ctx, 1); err == nil {
		t.Fatalf("ready without retries")
	}
	if p.Snapshot().LastError == nil {
		t.Errorf("no last error")
	}
	// Each failure arms a retry timer (1 s, 2 s, 4 s): wait for it, fire it.
	for p.Snapshot().Idle == nil {
		if clk.pending() > 0 {
			clk.Advance(4 * time.Second)
		}
		time.Sleep(time.Millisecond)
	}
	if err := p.WaitReady(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	_ = p.Close(context.Background())
}

func TestConcurrentGetPutClose(t *testing.T) {
	f := newFake()
	p, st := newPool(t, f, 64, Options{Target: 8, FillConcurrency: 3, Grace: time.Millisecond})
	ctx := context.Background()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				s, err := p.Get(ctx)
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					continue // exhausted for a moment
				}
				if r.IntN(4) == 0 {
					time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond)
				}
				_ = p.Put(ctx, s)
				_ = p.Snapshot()
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	if err := p.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	close(stop)
	wg.Wait()
	if live := f.liveIndices(); len(live) != 0 {
		t.Errorf("slots left: %v", live)
	}
	if snap := st.Snapshot(); snap.Free != 64 {
		t.Errorf("allocator after: %+v", snap)
	}
}

// Puts that arrive while a teardown runs are torn down together in the next
// one; a failed teardown is Put's error and quarantines the index.
func TestPutBatches(t *testing.T) {
	f := newFake()
	f.tdGate = make(chan struct{})
	f.tdStarted = make(chan []int, 4)
	p, st := newPool(t, f, 10, Options{Target: 0, Grace: time.Hour, FillConcurrency: 1})
	ctx := context.Background()
	var ss []*slot.Slot
	for range 4 {
		s, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	errc := make(chan error, 4)
	put := func(s *slot.Slot) { errc <- p.Put(ctx, s) }
	go put(ss[0])
	if got := <-f.tdStarted; !slices.Equal(got, []int{ss[0].Index}) {
		t.Fatalf("first teardown = %v", got)
	}
	for _, s := range ss[1:] {
		go put(s)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(p.Snapshot().Retiring) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("Puts not queued: %+v", p.Snapshot())
		}
		time.Sleep(time.Millisecond)
	}
	f.mu.Lock()
	f.failTd = map[int]bool{ss[3].Index: true}
	f.mu.Unlock()
	close(f.tdGate)
	var failed int
	for range 4 {
		if err := <-errc; err != nil {
			failed++
			if !strings.Contains(err.Error(), "injected teardown failure") {
				t.Errorf("Put error = %v", err)
			}
		}
	}
	if failed != 1 {
		t.Errorf("%d Puts failed, want 1", failed)
	}
	if got := <-f.tdStarted; len(got) != 3 {
		t.Errorf("second teardown = %v, want the 3 Puts queued meanwhile", got)
	}
	if snap := st.Snapshot(); snap.States[ss[3].Index-1] != index.Quarantined {
		t.Errorf("index %d after a failed teardown: %v", ss[3].Index, snap.States[ss[3].Index-1])
	}
	waitRest(t, p)
	if idle := p.Snapshot().Idle; len(idle) != 3 {
		t.Errorf("idle = %v, want 3 replacements (none for the slot whose teardown failed)", idle)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// A zero grace means zero: a replacement above target goes at once.
func TestZeroGrace(t *testing.T) {
	f := newFake()
	clk := newClock()
	p, _ := newPool(t, f, 10, Options{Target: 1, Grace: 0, Clock: clk})
	ctx := context.Background()
	if err := p.WaitReady(ctx, 1); err != nil {
		t.Fatal(err)
	}
	a, _ := p.Get(ctx)
	b, _ := p.Get(ctx)
	waitRest(t, p)
	if err := p.Put(ctx, a); err != nil {
		t.Fatal(err)
	}
	waitRest(t, p)
	clk.Advance(0)
	if idle := p.Snapshot().Idle; len(idle) != 1 {
		t.Errorf("idle = %v with grace 0, want the target 1", idle)
	}
	_ = p.Put(ctx, b)
	_ = p.Close(ctx)

	for _, o := range []Options{{Target: -1}, {Grace: -1}, {FillConcurrency: -1}, {MinBackoff: -1}} {
		if _, err := New(f, nil, o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}
