package reconcile_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/reconcile"
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
	st, err := index.New(10, []int{2, 5}) // 5 is quarantined and already clean
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
		t.Errorf("allocator: %+v", snap)
	}
	inv, _ := m.Scan(ctx)
	if !slices.Equal(inv.Indices(), []int{live.Index}) {
		t.Errorf("inventory: %v", inv)
	}
}

// A slot the pass cannot finish is in Pass.Failed with its index and
// error, stays quarantined, and Last reports the pass; before, the failure
// only reached OnPass folded into one joined error.
func TestPassCarriesFailures(t *testing.T) {
	env := nettest.New(t, 4)
	m := env.Manager(t)
	ctx := context.Background()
	c := m.Config()
	// Slot 2's name: a foreign bind mount with a namespace bound over it.
	// The namespace is ours and is detached; the mount below is not ours,
	// so the name cannot be removed.
	src := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(src, []byte("someone else's"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := c.NetnsPath(2)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, from := range []string{src, "/proc/self/ns/net"} {
		if err := unix.Mount(from, path, "none", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for unix.Unmount(path, unix.MNT_DETACH) == nil {
		}
	})
	st, err := index.New(4, []int{2})
	if err != nil {
		t.Fatal(err)
	}
	r := reconcile.New(m, st, reconcile.Options{})
	if _, ok := r.Last(); ok {
		t.Errorf("Last before any pass")
	}
	p, err := r.Once(ctx)
	if err == nil || p.Err == nil || len(p.Failed) != 1 || p.Failed[0].Index != 2 || !errors.Is(p.Failed[0].Err, netns.ErrNotNamespace) {
		t.Fatalf("pass: %+v, %v; want slot 2 failed with ErrNotNamespace", p, err)
	}
	if s, _ := st.State(2); s != index.Quarantined || len(p.Freed) != 0 {
		t.Errorf("slot 2 is %v, freed %v; want it quarantined", s, p.Freed)
	}
	last, ok := r.Last()
	if !ok || len(last.Failed) != 1 || last.Start != p.Start || last.Duration <= 0 {
		t.Errorf("Last = %+v, %v", last, ok)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "someone else's" {
		t.Errorf("the foreign mount changed: %q %v", b, err)
	}
}

// A quarantined index the caller keeps is never torn down, whatever a pass
// finds of it (a slot kept in safe mode: something lives in it and no
// record says whose); the other quarantined ones are, and a kept index
// whose slot is gone is freed.
func TestKeptSlotsAreNeverTornDown(t *testing.T) {
	env := nettest.New(t, 8)
	m := env.Manager(t)
	ctx := context.Background()
	nettest.Leak(t, m, []int{2, 3})
	st, err := index.New(8, []int{2, 3, 4}) // 4 kept, and nothing of it on the host
	if err != nil {
		t.Fatal(err)
	}
	kept := map[int]bool{2: true, 4: true}
	r := reconcile.New(m, st, reconcile.Options{Keep: func(i int) bool { return kept[i] }})
	p, err := r.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(p.Freed)
	if !slices.Equal(p.Freed, []int{3, 4}) {
		t.Errorf("freed %v, want [3 4]: the torn-down slot and the kept index with nothing left", p.Freed)
	}
	if !netns.IsMounted(m.Config().NetnsPath(2)) {
		t.Fatalf("the kept slot 2 was torn down")
	}
	if s, _ := st.State(2); s != index.Quarantined {
		t.Errorf("the kept slot 2 is %v, want quarantined", s)
	}
	if netns.IsMounted(m.Config().NetnsPath(3)) {
		t.Errorf("the quarantined slot 3 was not torn down")
	}
}
