package reconcile_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/reconcile"
	"github.com/phasegate/phasegate/network/storage"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestRunFreesQuarantinedAndSweepsStrays(t *testing.T) {
	env := nettest.New(t, 10)
	m := env.Manager(t)
	ctx := context.Background()
	nettest.Leak(t, m, []int{1, 2, 3})
	if err := m.Firewall().Add(ctx, m.Config().HostIfName(6)); err != nil { // element without slot
		t.Fatal(err)
	}
	st, err := storage.New(10, []int{2, 5}) // 5 is quarantined and already clean
	if err != nil {
		t.Fatal(err)
	}
	// A live, acquired slot must never be touched.
	i, _ := st.Acquire() // 1: it has a leftover, Create cleans it
	live, err := m.Create(ctx, i)
	if err != nil {
		t.Fatal(err)
	}
	passes := make(chan reconcile.Pass, 4)
	r := reconcile.New(m, st, reconcile.Options{Interval: 20 * time.Millisecond, OnPass: func(p reconcile.Pass) {
		select {
		case passes <- p:
		default:
		}
	}})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- r.Run(rctx) }()
	p := <-passes
	if p.Err != nil {
		t.Fatal(p.Err)
	}
	slices.Sort(p.Freed)
	if !slices.Equal(p.Claimed, []int{3, 6}) || !slices.Equal(p.Freed, []int{2, 3, 5, 6}) {
		t.Errorf("pass: claimed %v freed %v", p.Claimed, p.Freed)
	}
	p = <-passes // a second pass finds nothing to do
	if len(p.Claimed) != 0 || len(p.Freed) != 0 || p.Teardown != nil {
		t.Errorf("second pass: %+v", p)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
	if !netns.IsMounted(live.NetnsPath) {
		t.Errorf("the acquired slot was torn down")
	}
	if snap := st.Snapshot(); snap.Acquired != 1 || snap.Quarantined != 0 || snap.Free != 9 {
		t.Errorf("storage: %+v", snap)
	}
	inv, _ := m.Scan(ctx)
	if !slices.Equal(inv.Indices(), []int{live.Index}) {
		t.Errorf("inventory: %v", inv)
	}
}
