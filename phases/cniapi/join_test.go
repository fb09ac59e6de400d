package cniapi

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A key's second taker waits for the first; another key does not; a wait
// ends with its context, and the key is free again after.
func TestKeyLocksOrderOneKey(t *testing.T) {
	var k keyLocks
	ctx := context.Background()
	unlock, err := k.lock(ctx, "cni/net\x00c1/eth0")
	if err != nil {
		t.Fatal(err)
	}
	other, err := k.lock(ctx, "cni/net\x00c2/eth0")
	if err != nil {
		t.Fatalf("another key waited: %v", err)
	}
	other()
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := k.lock(short, "cni/net\x00c1/eth0"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second taker of a held key: %v, want it to wait until its context ends", err)
	}
	got := make(chan error, 1)
	go func() {
		u, err := k.lock(ctx, "cni/net\x00c1/eth0")
		if err == nil {
			u()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("the second taker did not wait (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.held) != 0 {
		t.Errorf("%d keys still held after every release", len(k.held))
	}
}
