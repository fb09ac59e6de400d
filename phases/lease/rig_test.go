package lease

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/phases/internal/leasetest"
)

// rig is a lease core over a real pool of real slots, in a netns
// directory and with a prefix of its own, swept at the end.
type rig struct {
	svc   *Service
	pool  *pool.Pool
	store *leases.Store
}

// newRig makes the rig with n slots, target warm.
func newRig(t testing.TB, n, target int) *rig {
	t.Helper()
	_, mgr, store := leasetest.NewSlotHost(t, n)
	pl := leasetest.NewPool(t, mgr, store, n, target)
	log := slog.New(slog.DiscardHandler)
	return &rig{svc: New(mgr, pl, Options{Records: NewRecords(store, log), Log: log}), pool: pl, store: store}
}

// A change of one slot's policy does not wait for another slot's: each
// slot has its own lock, which the lease's end takes too.
func TestSetEgressPolicyLocksPerSlot(t *testing.T) {
	r := newRig(t, 4, 2)
	ctx, c := context.Background(), leasetest.CallerOf(leasetest.Root, nil)
	var ids []string
	var idx []int
	for k := range 2 {
		a, err := r.svc.Acquire(ctx, c, Request{Owner: "o", RequestID: fmt.Sprint(k)})
		if err != nil {
			t.Fatal(err)
		}
		ids, idx = append(ids, a.Lease.Rec.LeaseID), append(idx, a.Lease.Rec.Index)
	}
	set := func(k int) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := r.svc.SetEgress(ctx, c, idx[k], ids[k], func(egress.Defaults) (*egress.Policy, error) { return &egress.Policy{DenyAll: true}, nil })
			done <- err
		}()
		return done
	}
	release := func(k int) <-chan error {
		done := make(chan error, 1)
		go func() {
			err := r.svc.Release(ctx, c, idx[k], ids[k])
			done <- err
		}()
		return done
	}
	ns1 := *r.svc.At(idx[1]).Slot
	// A change of slot 1 under way: its lock is held.
	unlock := r.svc.lockPolicy(idx[1])
	blocked, ended := set(1), release(1)
	select {
	case err := <-set(0):
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("slot 0's policy change waited for slot 1's lock")
	}
	select {
	case err := <-blocked:
		t.Fatalf("slot 1's change went on while its lock was held: %v", err)
	default:
	}
	// The release ends the record, then waits for the lock before the slot
	// is torn down: the namespace is still there well after a teardown
	// would have taken it (one takes a few milliseconds here).
	leasetest.WaitUntil(t, "slot 1's record ended", func() bool { _, ok, _ := r.store.Get(idx[1]); return !ok })
	time.Sleep(300 * time.Millisecond)
	if id, err := netns.Stat(ns1.NetnsPath); err != nil || id != ns1.NetnsID {
		t.Fatalf("slot 1 was torn down while a change of its policy was under way: %v", err)
	}
	unlock()
	for _, c := range []<-chan error{blocked, ended} {
		select {
		case <-c: // either order: the change, then the release; or the release first, and the change refused
		case <-time.After(time.Minute):
			t.Fatal("slot 1's calls never ended once its lock was free")
		}
	}
}
