package pool

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/slot"
)

// waitLevel waits, on the pool's changes, until cond holds of its Level.
func waitLevel(t *testing.T, p *Pool, what string, cond func(Level) bool) Level {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ch := p.Changed()
		if lv := p.Level(); cond(lv) {
			return lv
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s: %+v", what, p.Level())
		}
	}
}

// A full node (every index handed out, lost or quarantined) is no
// failure: the fill stops without an error or a backoff, says so
// (Exhausted), a Get fails at once with ErrExhausted, and every way an
// index comes back (Put, PutLost, Free, RetireLost) resumes the fill at
// once, without a timer.
func TestFullNodeWaitsForAnIndexWithoutFailing(t *testing.T) {
	f := newFake()
	st, err := index.New(4, []int{4})
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{2, 3} { // two lost leases' indices, as runStorage claims them
		if err := st.Claim(i); err != nil {
			t.Fatal(err)
		}
	}
	clk := newClock() // no timer ever fires: a resumed fill must not wait for one
	p, err := New(f, st, Options{Target: 1, Clock: clk, Lost: []int{2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close(context.Background()) }()
	ctx := context.Background()
	if err := p.WaitReady(ctx, 1); err != nil {
		t.Fatal(err)
	}
	held, err := p.Get(ctx) // index 1: now every index is taken
	if err != nil {
		t.Fatal(err)
	}
	lv := waitLevel(t, p, "the fill to find no free index", func(lv Level) bool { return lv.Exhausted && lv.Filling == 0 })
	if lv.LastError != nil || lv.Backoff || lv.Idle != 0 || lv.Free != 0 || lv.Quarantined != 1 || lv.InUse != 1 {
		t.Errorf("level of a full node = %+v, want no error, no backoff, nothing idle or free", lv)
	}
	if !p.Snapshot().Exhausted {
		t.Errorf("Snapshot does not say the pool is exhausted")
	}
	getCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := p.Get(getCtx); !errors.Is(err, index.ErrExhausted) || getCtx.Err() != nil {
		t.Fatalf("Get on a full node = %v (ctx %v), want ErrExhausted at once", err, getCtx.Err())
	}

	// Each way an index comes back refills the pool at once; each slot
	// made is taken again, so that the node is full again.
	for _, back := range []struct {
		name string
		give func() error
	}{
		{"PutLost", func() error { return p.PutLost(2) }},
		{"RetireLost", func() error { return p.RetireLost(ctx, 3) }},
		{"Free", func() error { return p.Free(4) }},
		{"Put", func() error { return p.Put(ctx, held) }},
	} {
		if err := back.give(); err != nil {
			t.Fatalf("%s: %v", back.name, err)
		}
		waitLevel(t, p, "the refill after "+back.name, func(lv Level) bool { return lv.Idle == 1 })
		if back.name == "Put" {
			break
		}
		if _, err := p.Get(ctx); err != nil {
			t.Fatalf("after %s: Get: %v", back.name, err)
		}
		waitLevel(t, p, "a full node after "+back.name, func(lv Level) bool { return lv.Exhausted && lv.Filling == 0 })
	}
	if lv := p.Level(); lv.LastError != nil {
		t.Errorf("last error after the refills: %v", lv.LastError)
	}
}

// A slot Get took from the idle stack and Return gives back goes back
// without OnIdle (it went through it, and its record is as it was): a
// caller whose own record fails (a full filesystem) leaves the pool as it
// found it. One Get made on an empty pool goes through OnIdle, and is
// destroyed when OnIdle fails.
func TestReturnOfAWarmSlotKeepsThePool(t *testing.T) {
	f := newFake()
	var failing atomic.Bool
	var mu sync.Mutex
	var failedFor []*slot.Slot // the slots OnIdle saw while failing
	p, _ := newPool(t, f, 4, Options{Target: 1, Lull: -1, OnIdle: func(_ context.Context, s *slot.Slot) error {
		if !failing.Load() {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		failedFor = append(failedFor, s)
		return errors.New("no space left on device")
	}})
	defer func() { _ = p.Close(context.Background()) }()
	ctx := context.Background()
	if err := p.WaitReady(ctx, 1); err != nil {
		t.Fatal(err)
	}
	failing.Store(true)
	var returned []*slot.Slot
	for range 5 {
		s, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Return(s); err != nil {
			t.Fatalf("Return of a warm slot: %v", err)
		}
		returned = append(returned, s)
	}
	if lv := p.Level(); lv.Idle != 1 {
		t.Errorf("after 5 failed leases of the warm slot the pool holds %d idle, want 1", lv.Idle)
	}
	waitRest(t, p)
	mu.Lock()
	for _, s := range returned {
		if slices.Contains(failedFor, s) {
			t.Errorf("OnIdle was called for slot %d, which came from the idle stack", s.Index)
		}
	}
	mu.Unlock()
	// Made on demand: OnIdle decides.
	a, err := p.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Get(ctx) // the pool is empty now (its fill fails): made for this Get
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Return(b); err == nil {
		t.Errorf("Return of a slot made on demand whose OnIdle fails = nil, want the error")
	}
	if err := p.Return(a); err != nil {
		t.Errorf("Return of the warm one: %v", err)
	}
}
