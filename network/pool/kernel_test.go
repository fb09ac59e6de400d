package pool_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
)

func addrsInside(t *testing.T, s *slot.Slot) int {
	t.Helper()
	fd, err := netns.Open(s.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	as, _ := h.AddrList(l, netlink.FAMILY_V4)
	return len(as)
}

func addAddrInside(t *testing.T, s *slot.Slot) {
	t.Helper()
	fd, err := netns.Open(s.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, _ := h.LinkByName("eth0")
	a, _ := netlink.ParseAddr("192.0.2.9/24")
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatal(err)
	}
}

func TestPoolOnKernel(t *testing.T) {
	env := nettest.New(t, 8)
	m := env.Manager(t)
	ctx := context.Background()
	st, err := index.New(8, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pool.New(m, st, pool.Options{Target: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WaitReady(ctx, 2); err != nil {
		t.Fatal(err)
	}
	var got []*slot.Slot
	for range 3 { // the third is made on demand (or by a refill)
		s, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !netns.IsMounted(s.NetnsPath) {
			t.Fatalf("slot %d has no namespace", s.Index)
		}
		got = append(got, s)
	}
	// A slot given back is replaced by a fresh one at its index: what the
	// tenant added is gone with the namespace it was in.
	a := got[0]
	addAddrInside(t, a)
	rest := func() bool { s := p.Snapshot(); return s.Filling == 0 && len(s.Creating) == 0 }
	waitUntil(t, "the refill to target", rest)
	if err := p.Put(ctx, a); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the replacement", rest)
	if top := p.Snapshot().Idle[0]; top != a.Index {
		t.Fatalf("top of the idle stack is %d, want the replacement at %d", top, a.Index)
	}
	b, err := p.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel reuses a freed namespace's inode at once; the host
	// ifindex is what tells the two apart.
	if b.Index != a.Index || b.HostIfIndex == a.HostIfIndex {
		t.Errorf("replacement %+v, given back %+v: want the same index and a new veth", b, a)
	}
	if n := addrsInside(t, b); n != 1 {
		t.Errorf("replacement has %d addresses, want 1", n)
	}
	got[0] = b
	// Close leaves the three handed out; give one back first.
	if err := p.Put(ctx, got[0]); err != nil {
		t.Fatal(err)
	}
	got = got[1:]
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx); !errors.Is(err, pool.ErrClosed) {
		t.Errorf("Get after Close = %v", err)
	}
	// Only the two still handed out are left; Put destroys them.
	inv, _ := m.Scan(ctx)
	if len(inv) != 2 || inv[got[0].Index] != slot.All || inv[got[1].Index] != slot.All {
		t.Errorf("after Close: %v", inv)
	}
	for _, s := range got {
		if err := p.Put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	assertNothingLeft(t, m, st, 8)
}

func TestPoolCloseDuringFillOnKernel(t *testing.T) {
	env := nettest.New(t, 32)
	m := env.Manager(t)
	ctx := context.Background()
	st, _ := index.New(32, nil)
	p, err := pool.New(m, st, pool.Options{Target: 24, FillConcurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "3 idle slots made while more are being made", func() bool { return len(p.Snapshot().Idle) >= 3 })
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, m, st, 32)
}

func TestPoolConcurrentOnKernel(t *testing.T) {
	env := nettest.New(t, 16)
	m := env.Manager(t)
	ctx := context.Background()
	st, _ := index.New(16, nil)
	p, err := pool.New(m, st, pool.Options{Target: 4, FillConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg     sync.WaitGroup
		cycles atomic.Int64
	)
	for range 4 {
		wg.Go(func() {
			for range 15 {
				s, err := p.Get(ctx)
				if errors.Is(err, pool.ErrClosed) {
					return
				}
				if err != nil {
					continue
				}
				_ = p.Put(ctx, s)
				cycles.Add(1)
			}
		})
	}
	// Close in the middle of the churn: after some Get/Put cycles, while
	// most of the 60 are still to come.
	waitUntil(t, "8 Get/Put cycles", func() bool { return cycles.Load() >= 8 })
	if err := p.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	wg.Wait()
	assertNothingLeft(t, m, st, 16)
}

// assertNothingLeft checks that a closed pool left no slot resource, no
// mount and every index free in st (free of slots in all).
func assertNothingLeft(t *testing.T, m *slot.Manager, st *index.Allocator, free int) {
	t.Helper()
	if inv, err := m.Scan(context.Background()); err != nil || len(inv) != 0 {
		t.Errorf("left: %v (scan error: %v)", inv, err)
	}
	if ms := nettest.Mounts(t, m.Config().NetnsDir); len(ms) != 0 {
		t.Errorf("mounts left: %v", ms)
	}
	if snap := st.Snapshot(); snap.Free != free {
		t.Errorf("allocator: %+v, want %d free", snap, free)
	}
}

// waitUntil polls cond every millisecond for up to 30 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
