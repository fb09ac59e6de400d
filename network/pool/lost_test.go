package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/slot"
)

// The pool is the allocator's one owner: a lost lease's index and a
// quarantined index whose slot someone else removed go back through it,
// and only the indices it was given as lost are taken by PutLost.
func TestPutLostAndFree(t *testing.T) {
	f := newFake()
	st, err := index.New(4, []int{3})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Claim(2); err != nil { // the lost lease's, as runStorage claims it
		t.Fatal(err)
	}
	p, err := New(f, st, Options{Lost: []int{2}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close(context.Background()) }()
	if err := p.PutLost(1); !errors.Is(err, ErrNotFromPool) {
		t.Errorf("PutLost of an index not lost = %v, want ErrNotFromPool", err)
	}
	if err := p.PutLost(2); err != nil {
		t.Fatalf("PutLost: %v", err)
	}
	if err := p.PutLost(2); !errors.Is(err, ErrNotFromPool) {
		t.Errorf("PutLost twice = %v, want ErrNotFromPool", err)
	}
	if got := p.Quarantined(); !slices.Equal(got, []int{3}) {
		t.Errorf("Quarantined = %v, want [3]", got)
	}
	if err := p.Free(3); err != nil {
		t.Fatalf("Free: %v", err)
	}
	if err := p.Free(3); !errors.Is(err, index.ErrNotQuarantined) {
		t.Errorf("Free twice = %v, want ErrNotQuarantined", err)
	}
	if !p.QuarantineIfFree(4) || p.QuarantineIfFree(4) {
		t.Errorf("QuarantineIfFree: want true on a free index, then false")
	}
	if s, _ := p.State(4); s != index.Quarantined {
		t.Errorf("State(4) = %v, want quarantined", s)
	}
	snap := p.Indices()
	if want := []index.State{index.Free, index.Free, index.Free, index.Quarantined}; !slices.Equal(snap.States, want) {
		t.Errorf("Indices = %v, want %v", snap.States, want)
	}
}

// A held slot's quarantined index is adopted as handed out, and given back
// by Put; a lost lease's index whose slot is held is quarantined when the
// lease ends, not freed.
func TestAdoptAndHoldLost(t *testing.T) {
	f := newFake()
	st, err := index.New(4, []int{3})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Claim(2); err != nil {
		t.Fatal(err)
	}
	p, err := New(f, st, Options{Lost: []int{2}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close(context.Background()) }()
	s3 := &slot.Slot{Index: 3}
	if err := p.Adopt(&slot.Slot{Index: 1}); !errors.Is(err, index.ErrNotQuarantined) {
		t.Errorf("Adopt of a free index = %v, want ErrNotQuarantined", err)
	}
	if err := p.Adopt(s3); err != nil {
		t.Fatal(err)
	}
	if s, _ := p.State(3); s != index.Acquired {
		t.Errorf("State(3) after Adopt = %v, want acquired", s)
	}
	if err := p.Adopt(s3); !errors.Is(err, ErrNotFromPool) {
		t.Errorf("Adopt twice = %v, want ErrNotFromPool", err)
	}
	if err := p.HoldLost(1); !errors.Is(err, ErrNotFromPool) {
		t.Errorf("HoldLost of an index not lost = %v, want ErrNotFromPool", err)
	}
	if err := p.HoldLost(2); err != nil {
		t.Fatal(err)
	}
	if s, _ := p.State(2); s != index.Quarantined {
		t.Errorf("State(2) after HoldLost = %v, want quarantined", s)
	}
	if err := p.PutLost(2); !errors.Is(err, ErrNotFromPool) {
		t.Errorf("PutLost after HoldLost = %v, want ErrNotFromPool", err)
	}
	if err := p.Put(context.Background(), s3); err != nil {
		t.Fatalf("Put of the adopted slot: %v", err)
	}
	if !slices.Contains(f.tornDown(), 3) {
		t.Errorf("the adopted slot was not torn down by Put: %v", f.tornDown())
	}
}

// Retire returns once its slot is torn down, while its replacement is
// still being made (Put waits for that: TestPutBatches).
func TestRetireReturnsBeforeTheReplacement(t *testing.T) {
	f := newFake()
	p, _ := newPool(t, f, 10, Options{Target: 0, Grace: time.Hour, FillConcurrency: 1})
	ctx := context.Background()
	a, err := p.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitRest(t, p)
	f.mu.Lock()
	f.gate = make(chan struct{}) // the replacement hangs
	f.mu.Unlock()
	retired := make(chan error, 1)
	go func() { retired <- p.Retire(ctx, a) }()
	select {
	case err := <-retired:
		if err != nil {
			t.Fatalf("Retire: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Retire waited for the replacement")
	}
	if st, _ := p.State(a.Index); st == index.Quarantined {
		t.Errorf("index %d quarantined after a teardown that succeeded", a.Index)
	}
	f.mu.Lock()
	close(f.gate)
	f.gate = nil
	f.mu.Unlock()
	waitRest(t, p)
	if idle := p.Snapshot().Idle; len(idle) != 1 {
		t.Errorf("idle = %v, want the replacement", idle)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// A Get on a pool whose every index is taken, one of them by the
// replacement of a slot just retired, waits for that replacement rather
// than failing as exhausted; with nothing being made, it fails at once.
func TestGetWaitsForTheReplacementOfAFullPool(t *testing.T) {
	f := newFake()
	p, _ := newPool(t, f, 2, Options{Target: 0, Grace: time.Hour, FillConcurrency: 1})
	ctx := context.Background()
	a, err := p.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx); !errors.Is(err, index.ErrExhausted) {
		t.Fatalf("Get on a full pool with nothing being made: %v, want ErrExhausted", err)
	}
	f.mu.Lock()
	f.gate = make(chan struct{}) // the replacement hangs with a's index
	f.started = make(chan int, 1)
	started := f.started
	f.mu.Unlock()
	if err := p.Retire(ctx, a); err != nil {
		t.Fatalf("Retire: %v", err)
	}
	<-started
	got := make(chan error, 1)
	go func() {
		s, err := p.Get(ctx)
		if err == nil && s.Index != a.Index {
			err = fmt.Errorf("got slot %d, want the replacement at %d", s.Index, a.Index)
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Get returned before the replacement was made: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	f.mu.Lock()
	close(f.gate)
	f.gate, f.started = nil, nil
	f.mu.Unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Get once the replacement is made: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Get never got the replacement")
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// A Get on a full pool waits for a slot given to Discard, which returns
// before the teardown: its index comes back, and its replacement is the
// Get's.
func TestGetWaitsForADiscardedSlot(t *testing.T) {
	f := newFake()
	f.tdGate = make(chan struct{}) // the teardown hangs
	p, _ := newPool(t, f, 1, Options{Target: 0, Grace: time.Hour, FillConcurrency: 1})
	ctx := context.Background()
	a, err := p.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Discard(ctx, a); err != nil {
		t.Fatalf("Discard: %v", err)
	}
	if err := p.Discard(ctx, a); !errors.Is(err, ErrNotFromPool) {
		t.Errorf("a second Discard of the slot: %v, want ErrNotFromPool", err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := p.Get(ctx)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Get returned during the teardown: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(f.tdGate)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Get once the discarded slot is torn down: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Get never got a slot")
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
