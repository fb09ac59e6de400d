package leases

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// TestFailedOpIsTakenOutOfItsBatch holds a transaction open until three
// writes have queued behind it, so that they share the next one, in which
// the middle write changes the store and then fails. Its change must be
// rolled back, and the other two committed in a retry without it.
func TestFailedOpIsTakenOutOfItsBatch(t *testing.T) {
	s := openTemp(t)
	gate, entered := make(chan struct{}), make(chan struct{})
	put := func(i int) func(t *txn) error {
		return func(t *txn) error {
			r := idle(i)
			v, err := encode(&r)
			if err != nil {
				return err
			}
			return t.bucket(inSlots).Put(slotKey(i), v)
		}
	}
	boom := errors.New("boom")
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.write(func(t *txn) error { close(entered); <-gate; return put(1)(t) }); err != nil {
			t.Error(err)
		}
	})
	waitQueued := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			s.mu.Lock()
			q, leading := len(s.queue), s.leading
			s.mu.Unlock()
			if leading && q == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("queue never reached %d writes", n)
			}
		}
	}
	<-entered
	before := s.txs.Load()
	errs := make([]error, 3)
	for k, fn := range []func(*txn) error{
		put(2),
		func(t *txn) error {
			if err := put(3)(t); err != nil {
				return err
			}
			return boom
		},
		put(4),
	} {
		wg.Go(func() { errs[k] = s.write(fn) })
		waitQueued(k + 1)
	}
	close(gate)
	wg.Wait()

	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], boom) {
		t.Fatalf("errors %v, want nil, boom, nil", errs)
	}
	for i, want := range map[int]bool{1: true, 2: true, 3: false, 4: true} {
		if _, ok, err := s.Get(i); err != nil || ok != want {
			t.Fatalf("slot %d: present %v (%v), want %v", i, ok, err, want)
		}
	}
	// The gated group, the shared one that failed, its retry.
	if n := s.txs.Load() - before; n != 2 {
		t.Fatalf("%d groups after the gated one, want 2 (the failed shared one and its retry)", n)
	}
}
