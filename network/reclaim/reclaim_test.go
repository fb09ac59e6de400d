package reclaim_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/reconcile"
	"github.com/phasegate/phasegate/network/slot"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func seq(from, to int) []int {
	out := make([]int, 0, to-from+1)
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// foreign is everything reclaim must leave alone.
type foreign struct {
	other       *slot.Manager
	otherSlot   *slot.Slot
	paths       map[string]bool // path -> must be a mounted namespace
	symlink     string
	dir         string
	foreignLink string
}

func makeForeign(t *testing.T, m *slot.Manager) *foreign {
	t.Helper()
	ctx := context.Background()
	c := m.Config()
	f := &foreign{paths: map[string]bool{}}
	// Another prefix in the same directory, with a full slot of its own
	// (netns, veth, element in its own table).
	oc := c
	oc.Prefix = nettest.RandomPrefix()
	oc.Slots = 4
	oc.CIDR = netip.MustParsePrefix("169.254.160.0/24")
	t.Cleanup(func() { _ = nettest.Sweep(oc) })
	other, err := slot.NewManager(ctx, oc, slot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.other = other
	if f.otherSlot, err = other.Create(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// Names with our prefix that are not ours (beyond Slots too).
	for _, n := range []string{c.Prefix + "abc", c.Prefix + "0", c.Prefix + "007", c.Prefix + "0" + strconv.Itoa(c.Slots+1)} {
		p, err := netns.Create(ctx, c.NetnsDir, n)
		if err != nil {
			t.Fatal(err)
		}
		f.paths[p] = true
	}
	f.symlink = c.NetnsPath(c.Slots - 1)
	if err := os.Symlink(f.otherSlot.NetnsPath, f.symlink); err != nil {
		t.Fatal(err)
	}
	f.dir = c.NetnsPath(c.Slots - 2)
	if err := os.Mkdir(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A link with our prefix but no index.
	f.foreignLink = c.Prefix + "hx"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: f.foreignLink}, PeerName: c.Prefix + "hy"}); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *foreign) check(t *testing.T) {
	t.Helper()
	for p := range f.paths {
		if !netns.IsMounted(p) {
			t.Errorf("foreign %s was touched", p)
		}
	}
	if !netns.IsMounted(f.otherSlot.NetnsPath) {
		t.Errorf("other prefix's netns was touched")
	}
	if _, err := netlink.LinkByName(f.otherSlot.HostIf); err != nil {
		t.Errorf("other prefix's link was touched: %v", err)
	}
	if els, _ := f.other.Firewall().List(context.Background()); !slices.Contains(els, f.otherSlot.HostIf) {
		t.Errorf("other prefix's element was touched: %v", els)
	}
	if fi, err := os.Lstat(f.symlink); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("symlink touched: %v", err)
	}
	if fi, err := os.Lstat(f.dir); err != nil || !fi.IsDir() {
		t.Errorf("directory touched: %v", err)
	}
	if _, err := netlink.LinkByName(f.foreignLink); err != nil {
		t.Errorf("foreign link %s touched: %v", f.foreignLink, err)
	}
}

func TestReclaim2000(t *testing.T) {
	const leaked, n = 2000, 2100
	env := nettest.New(t, n)
	m := env.Manager(t)
	ctx := context.Background()
	c := m.Config()
	nettest.Leak(t, m, seq(1, leaked))
	leakStrays(t, m)
	// An orphan process inside slot 7.
	orphan := nettest.StartInside(t, c.NetnsPath(7))
	f := makeForeign(t, m)

	// Budget: 1500 now, the rest deferred.
	var (
		mu    sync.Mutex
		calls int
		last  int
	)
	rep, err := reclaim.Run(ctx, m, reclaim.Options{MaxSlots: 1500, Progress: func(done, total int) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if done != last+1 || total != leaked+2 {
			t.Errorf("progress(%d, %d) after %d", done, total, last)
		}
		last = done
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(rep)
	if rep.Found != leaked+2 || len(rep.Reclaimed) != 1500 || len(rep.Failed) != 0 || len(rep.Deferred) != leaked+2-1500 {
		t.Fatalf("report: %v (%v)", rep, errors.Join(failures(rep)...))
	}
	if calls != 1500 {
		t.Errorf("progress calls = %d", calls)
	}
	if len(rep.Orphans) != 1 || rep.Orphans[0].PID != orphan.Process.Pid || rep.Orphans[0].Index != 7 || rep.Orphans[0].Killed {
		t.Errorf("orphans = %+v", rep.Orphans)
	}
	if !slices.Contains(rep.CutOff, 7) {
		t.Errorf("orphan's slot not cut off: %v", rep.CutOff)
	}
	if _, err := netlink.LinkByName(c.HostIfName(7)); err == nil {
		t.Errorf("orphan's host link still there")
	}
	if err := unix.Kill(orphan.Process.Pid, 0); err != nil {
		t.Errorf("orphan killed without KillOrphans")
	}
	if !slices.Equal(rep.Quarantine(), rep.Deferred) {
		t.Errorf("Quarantine() = %v", rep.Quarantine())
	}
	f.check(t)

	st := storageKeepsDeferred(t, n, rep)

	// The reconciler finishes the deferred ones and frees them.
	r := reconcile.New(m, st, reconcile.Options{})
	pass, err := r.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pass.Freed) != len(rep.Deferred) || len(pass.Claimed) != 0 {
		t.Errorf("pass: freed %d claimed %d, want %d/0", len(pass.Freed), len(pass.Claimed), len(rep.Deferred))
	}
	if snap := st.Snapshot(); snap.Free != n || snap.Quarantined != 0 {
		t.Errorf("storage after reconcile: free %d quarantined %d", snap.Free, snap.Quarantined)
	}
	inv, err := m.Scan(ctx)
	if err != nil || len(inv) != 0 {
		t.Errorf("left after reclaim + reconcile: %v (%v)", inv, err)
	}
	links := nettest.HostLinks(t, c.HostIfPrefix())
	slices.Sort(links)
	if !slices.Equal(links, []string{c.Prefix + "hx", c.Prefix + "hy"}) {
		t.Errorf("host links left: %v", links)
	}
	f.check(t)
}

// leakStrays leaks what is no slot but is the prefix's: a host link
// whose netns file is gone (a descriptor keeps the namespace), at slot
// 2050, and a set element without a slot, at 2060.
func leakStrays(t *testing.T, m *slot.Manager) {
	t.Helper()
	ctx := context.Background()
	stray, err := m.Create(ctx, 2050)
	if err != nil {
		t.Fatal(err)
	}
	nettest.StartHolder(t, stray.NetnsPath)
	if err := unix.Unmount(stray.NetnsPath, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(stray.NetnsPath); err != nil {
		t.Fatal(err)
	}
	if err := m.Firewall().Add(ctx, m.Config().HostIfName(2060)); err != nil {
		t.Fatal(err)
	}
}

// storageKeepsDeferred checks storage of n indices, quarantining rep's,
// never hands out a deferred index and hands out every other; it returns
// the storage with every index released again.
func storageKeepsDeferred(t *testing.T, n int, rep *reclaim.Report) *index.Allocator {
	t.Helper()
	st, err := index.New(n, rep.Quarantine())
	if err != nil {
		t.Fatal(err)
	}
	deferred := map[int]bool{}
	for _, i := range rep.Deferred {
		deferred[i] = true
	}
	var got []int
	for {
		i, err := st.Acquire()
		if err != nil {
			break
		}
		if deferred[i] {
			t.Fatalf("storage handed out deferred index %d", i)
		}
		got = append(got, i)
	}
	if len(got) != n-len(rep.Deferred) {
		t.Errorf("acquired %d, want %d", len(got), n-len(rep.Deferred))
	}
	for _, i := range got {
		if err := st.Release(i); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

func failures(r *reclaim.Report) []error {
	var out []error
	for _, f := range r.Failed {
		out = append(out, f.Err)
	}
	return out
}

func TestReclaimKillOrphans(t *testing.T) {
	env := nettest.New(t, 8)
	m := env.Manager(t)
	ctx := context.Background()
	nettest.Leak(t, m, []int{1, 2, 3})
	orphan := nettest.StartInside(t, m.Config().NetnsPath(2))
	rep, err := reclaim.Run(ctx, m, reclaim.Options{KillOrphans: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Reclaimed) != 3 || len(rep.Orphans) != 1 || !rep.Orphans[0].Killed {
		t.Fatalf("report: %v orphans %+v", rep, rep.Orphans)
	}
	_ = orphan.Wait()
	if inv, _ := m.Scan(ctx); len(inv) != 0 {
		t.Errorf("left: %v", inv)
	}
}

// A count budget, a cancelled context and a spent time budget each defer
// what they did not start, and the deferred slots stay on the host.
func TestReclaimBudgets(t *testing.T) {
	env := nettest.New(t, 16)
	m := env.Manager(t)
	ctx := context.Background()
	nettest.Leak(t, m, seq(1, 10))
	rep, err := reclaim.Run(ctx, m, reclaim.Options{MaxSlots: 7})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Reclaimed) != 7 || len(rep.Deferred) != 3 {
		t.Fatalf("count budget: %v", rep)
	}
	inv, _ := m.Scan(ctx)
	if deferred := slices.Sorted(slices.Values(rep.Deferred)); !slices.Equal(inv.Indices(), deferred) {
		t.Errorf("left: %v, deferred %v", inv, rep.Deferred)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	rep, err = reclaim.Run(cctx, m, reclaim.Options{})
	if !errors.Is(err, context.Canceled) || len(rep.Reclaimed) != 0 {
		t.Errorf("cancelled run: %v, %v", rep, err)
	}
	rep, err = reclaim.Run(ctx, m, reclaim.Options{Budget: 1}) // 1 ns: nothing starts
	if err != nil || len(rep.Deferred) != 3 || len(rep.Reclaimed) != 0 {
		t.Errorf("time budget: %v, %v", rep, err)
	}
}

// Slots left by a run with a larger --slots are reclaimed and listed in
// Beyond; those deferred are never quarantined (the allocator covers
// [1, N] only, and index.New refuses an index beyond it) and the
// reconciler sweeps them. Before, names beyond N were foreign and kept for
// ever.
func TestReclaimBeyondSlots(t *testing.T) {
	const n = 8
	env := nettest.New(t, n)
	m := env.Manager(t)
	ctx := context.Background()
	bigCfg := m.Config()
	bigCfg.Slots = 2 * n
	big, err := slot.NewManager(ctx, bigCfg, slot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	nettest.Leak(t, big, []int{3, 12, 16})
	rep, err := reclaim.Run(ctx, m, reclaim.Options{MaxSlots: 1})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Found != 3 || !slices.Equal(rep.Beyond, []int{12, 16}) || !slices.Equal(rep.Reclaimed, []int{3}) ||
		!slices.Equal(rep.Deferred, []int{12, 16}) || len(rep.Quarantine()) != 0 {
		t.Fatalf("report: %v beyond %v deferred %v quarantine %v", rep, rep.Beyond, rep.Deferred, rep.Quarantine())
	}
	st, err := index.New(n, rep.Quarantine())
	if err != nil {
		t.Fatalf("index.New with the report's quarantine: %v", err)
	}
	pass, err := reconcile.New(m, st, reconcile.Options{}).Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pass.Beyond, []int{12, 16}) || len(pass.Failed) != 0 || pass.Teardown == nil ||
		!slices.Equal(pass.Teardown.Reclaimed, []int{12, 16}) {
		t.Errorf("pass: %+v", pass)
	}
	for _, i := range []int{3, 12, 16} {
		if netns.IsMounted(bigCfg.NetnsPath(i)) {
			t.Errorf("slot %d left", i)
		}
	}
	if links := nettest.HostLinks(t, bigCfg.HostIfPrefix()); len(links) != 0 {
		t.Errorf("host links left: %v", links)
	}
	if els, _ := m.Firewall().List(ctx); len(els) != 0 {
		t.Errorf("elements left: %v", els)
	}
	rep, err = reclaim.Run(ctx, m, reclaim.Options{})
	if err != nil || rep.Found != 0 {
		t.Errorf("second run: %v, %v", rep, err)
	}
}

func TestQuarantine(t *testing.T) {
	rep := &reclaim.Report{
		Slots:      10,
		Deferred:   []int{9, 12},
		Failed:     []slot.Failure{{Index: 4}, {Index: 11}, {Index: 9}},
		Unreadable: []slot.Unreadable{{Index: 2}, {Index: 30}},
	}
	if q := rep.Quarantine(); !slices.Equal(q, []int{2, 4, 9}) {
		t.Errorf("Quarantine() = %v, want [2 4 9]", q)
	}
}
