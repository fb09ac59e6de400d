package slot_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/slot"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// checkSlot verifies everything Create promises.
func checkSlot(t *testing.T, m *slot.Manager, s *slot.Slot) {
	t.Helper()
	if !netns.IsMounted(s.NetnsPath) {
		t.Fatalf("%s is not a mounted namespace", s.NetnsPath)
	}
	host, err := netlink.LinkByName(s.HostIf)
	if err != nil {
		t.Fatalf("host link: %v", err)
	}
	if host.Attrs().Flags&1 == 0 { // net.FlagUp
		t.Errorf("host link down")
	}
	addrs := hostAddrs(t, host, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != s.HostAddr.String() {
		t.Errorf("host addrs = %v, want %s", addrs, s.HostAddr)
	}
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
	links, _ := h.LinkList()
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
		if l.Attrs().Flags&1 == 0 {
			t.Errorf("%s down inside", l.Attrs().Name)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"eth0", "lo"}) {
		t.Errorf("links inside = %v", names)
	}
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ = h.AddrList(eth0, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != s.InsideAddr.String() {
		t.Errorf("inside addrs = %v, want %s", addrs, s.InsideAddr)
	}
	routes, _ := h.RouteList(nil, netlink.FAMILY_V4)
	def := false
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.String() == s.HostAddr.Addr().String() {
			def = true
		}
	}
	if !def {
		t.Errorf("no default route via %s: %v", s.HostAddr.Addr(), routes)
	}
	els, err := m.Firewall().List(context.Background())
	if err != nil || !slices.Contains(els, s.HostIf) {
		t.Errorf("set elements = %v, %v; want %s", els, err, s.HostIf)
	}
}

func checkGone(t *testing.T, m *slot.Manager, i int) {
	t.Helper()
	c := m.Config()
	if _, err := os.Lstat(c.NetnsPath(i)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns file of %d still there: %v", i, err)
	}
	for _, mt := range nettest.Mounts(t, c.NetnsDir) {
		if strings.Contains(mt, c.NetnsPath(i)+" ") {
			t.Errorf("still mounted: %s", mt)
		}
	}
	if _, err := netlink.LinkByName(c.HostIfName(i)); err == nil {
		t.Errorf("host link %s still there", c.HostIfName(i))
	}
	els, _ := m.Firewall().List(context.Background())
	if slices.Contains(els, c.HostIfName(i)) {
		t.Errorf("set element %s still there", c.HostIfName(i))
	}
}

func TestCreateDestroy(t *testing.T) {
	env := nettest.New(t, 16)
	m := env.Manager(t)
	ctx := context.Background()
	rules, err := m.Firewall().RuleCount(ctx)
	if err != nil || rules != nft.FixedRules {
		t.Fatalf("rules = %d, %v; want %d", rules, err, nft.FixedRules)
	}
	var made []*slot.Slot
	for _, i := range []int{1, 2, 16} {
		s, err := m.Create(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		want := m.Config().Slot(i)
		want.NetnsID, want.HostIfIndex = s.NetnsID, s.HostIfIndex
		if *s != want || s.NetnsID == (netns.ID{}) || s.HostIfIndex == 0 {
			t.Errorf("Create returned %+v", s)
		}
		checkSlot(t, m, s)
		made = append(made, s)
	}
	if n, _ := m.Firewall().RuleCount(ctx); n != rules {
		t.Errorf("rule count grew with slots: %d -> %d", rules, n)
	}
	if _, err := m.Create(ctx, 17); !errors.Is(err, slot.ErrIndex) {
		t.Errorf("Create(17) = %v, want ErrIndex", err)
	}
	inv, err := m.Scan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(inv) != 3 || inv[1] != slot.All || inv[16] != slot.All {
		t.Errorf("Scan = %v", inv)
	}
	for _, s := range made {
		if err := m.Destroy(ctx, s.Index); err != nil {
			t.Fatal(err)
		}
		checkGone(t, m, s.Index)
		if err := m.Destroy(ctx, s.Index); err != nil {
			t.Errorf("second Destroy: %v", err)
		}
	}
	if ms := nettest.Mounts(t, m.Config().NetnsDir); len(ms) != 0 {
		t.Errorf("mounts left: %v", ms)
	}
}

func TestCreateCleansLeftover(t *testing.T) {
	env := nettest.New(t, 4)
	m := env.Manager(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, 3); err != nil {
		t.Fatal(err)
	}
	// Crash-like leftover: the same index again, without Destroy.
	s, err := m.Create(ctx, 3)
	if err != nil {
		t.Fatalf("Create over a leftover: %v", err)
	}
	checkSlot(t, m, s)
	// A half leftover: only the host link (its namespace file gone).
	path := m.Config().NetnsPath(3)
	holder := nettest.StartHolder(t, path) // keeps the namespace and its veth alive
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if s, err = m.Create(ctx, 3); err != nil {
		t.Fatalf("Create over a stray host link: %v", err)
	}
	checkSlot(t, m, s)
	_ = holder
}

// hashicorp/nomad PR #25714 at slot level: a process holds a descriptor on the netns
// file, another lives inside; Destroy succeeds, leaves no mount, no file and
// no host end.
func TestDestroyWhileHeld(t *testing.T) {
	env := nettest.New(t, 4)
	m := env.Manager(t)
	ctx := context.Background()
	s, err := m.Create(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	nettest.StartHolder(t, s.NetnsPath)
	nettest.StartInside(t, s.NetnsPath)
	if err := m.Destroy(ctx, 1); err != nil {
		t.Fatalf("Destroy while held: %v", err)
	}
	checkGone(t, m, 1)
	if ents, _ := os.ReadDir(m.Config().NetnsDir); len(ents) != 0 {
		t.Errorf("directory not empty: %v", ents)
	}
}

func TestScanIgnoresForeign(t *testing.T) {
	env := nettest.New(t, 20)
	m := env.Manager(t)
	ctx := context.Background()
	c := m.Config()
	if _, err := m.Create(ctx, 5); err != nil {
		t.Fatal(err)
	}
	other := nettest.RandomPrefix()
	for _, n := range []string{c.Prefix + "abc", c.Prefix + "21", c.Prefix + "05", other + "1"} {
		if _, err := netns.Create(ctx, c.NetnsDir, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(c.NetnsPath(5), c.NetnsPath(6)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(c.NetnsPath(7), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.NetnsPath(8), []byte("not a namespace"), 0o600); err != nil {
		t.Fatal(err)
	}
	inv, err := m.Scan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// <prefix>21 is beyond Slots but canonical: ours (see TestSurveyBeyondSlots).
	if len(inv) != 2 || inv[5] != slot.All || inv[21] != slot.HasNetns {
		t.Errorf("Scan = %v, want only slots 5 and 21", inv)
	}
	t.Cleanup(func() { _ = nettest.Sweep(slot.Config{Prefix: other, NetnsDir: c.NetnsDir, Slots: 1, CIDR: c.CIDR}) })
}

func TestTeardownOrphans(t *testing.T) {
	env := nettest.New(t, 8)
	m := env.Manager(t)
	ctx := context.Background()
	c := m.Config()
	nettest.Leak(t, m, []int{1, 2, 3, 4})
	inside := nettest.StartInside(t, c.NetnsPath(2))
	victim := nettest.StartInside(t, c.NetnsPath(3))
	holder := nettest.StartHolder(t, c.NetnsPath(4))

	inv, err := m.Scan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res := m.Teardown(ctx, inv.Only([]int{1, 2, 4}), slot.TeardownOptions{HostGoneTimeout: 500 * time.Millisecond})
	if len(res.Reclaimed) != 3 || len(res.Failed) != 0 || len(res.Deferred) != 0 {
		t.Fatalf("result: %v (%v)", res, res.Err())
	}
	if len(res.Orphans) != 1 || res.Orphans[0].PID != inside.Process.Pid || res.Orphans[0].Index != 2 ||
		res.Orphans[0].Killed || res.Orphans[0].Comm != "sleep" {
		t.Errorf("orphans = %+v", res.Orphans)
	}
	if !slices.Equal(res.CutOff, []int{2, 4}) {
		t.Errorf("cut off = %v, want [2 4]", res.CutOff)
	}
	if len(res.Holders) != 1 || res.Holders[0].Index != 4 || res.Holders[0].PID != holder.Process.Pid {
		t.Errorf("holders = %+v, want pid %d on slot 4", res.Holders, holder.Process.Pid)
	}
	for _, i := range []int{1, 2, 4} {
		checkGone(t, m, i)
	}
	if err := unix.Kill(inside.Process.Pid, 0); err != nil {
		t.Errorf("orphan was killed without KillOrphans")
	}

	res = m.Teardown(ctx, inv.Only([]int{3}), slot.TeardownOptions{KillOrphans: true})
	if len(res.Reclaimed) != 1 || len(res.Orphans) != 1 || !res.Orphans[0].Killed || len(res.CutOff) != 0 {
		t.Errorf("kill result: %v %+v cut %v", res, res.Orphans, res.CutOff)
	}
	_ = victim.Wait()
	checkGone(t, m, 3)
}

func TestTeardownBudget(t *testing.T) {
	env := nettest.New(t, 16)
	m := env.Manager(t)
	ctx := context.Background()
	nettest.Leak(t, m, []int{1, 2, 3, 4, 5, 6})
	inv, err := m.Scan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var calls []int
	res := m.Teardown(ctx, inv, slot.TeardownOptions{MaxSlots: 4, Workers: 2,
		Progress: func(done, total int) {
			if total != 6 {
				t.Errorf("total = %d", total)
			}
			calls = append(calls, done)
		}})
	if !slices.Equal(res.Reclaimed, []int{1, 2, 3, 4}) || !slices.Equal(res.Deferred, []int{5, 6}) {
		t.Errorf("result: reclaimed %v deferred %v", res.Reclaimed, res.Deferred)
	}
	if !slices.Equal(calls, []int{1, 2, 3, 4}) {
		t.Errorf("progress calls = %v", calls)
	}
	res = m.Teardown(ctx, inv.Only(res.Deferred), slot.TeardownOptions{Deadline: time.Now().Add(-time.Second)})
	if len(res.Reclaimed) != 0 || len(res.Deferred) != 2 {
		t.Errorf("expired deadline: %v", res)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	res = m.Teardown(cctx, inv.Only([]int{5, 6}), slot.TeardownOptions{})
	if len(res.Deferred) != 2 {
		t.Errorf("cancelled ctx: %v", res)
	}
	res = m.Teardown(ctx, slot.Assume(5, 6, 7), slot.TeardownOptions{})
	if !slices.Equal(res.Reclaimed, []int{5, 6, 7}) {
		t.Errorf("assumed inventory: %v %v", res, res.Err())
	}
	for i := 1; i <= 7; i++ {
		checkGone(t, m, i)
	}
}

func TestScanSeesHostLinks(t *testing.T) {
	env := nettest.New(t, 4)
	m := env.Manager(t)
	ctx := context.Background()
	s, err := m.Create(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	// A host link alone (its namespace kept alive by a holder, file gone).
	nettest.StartHolder(t, s.NetnsPath)
	if err := unix.Unmount(s.NetnsPath, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(s.NetnsPath); err != nil {
		t.Fatal(err)
	}
	if err := m.Firewall().Remove(ctx, s.HostIf); err != nil {
		t.Fatal(err)
	}
	inv, err := m.Scan(ctx)
	if err != nil || len(inv) != 1 || inv[2] != slot.HasHostLink || inv[2].String() != "link" {
		t.Fatalf("Scan = %v, %v; want 2:link", inv, err)
	}
	res := m.Teardown(ctx, inv, slot.TeardownOptions{})
	if !slices.Equal(res.Reclaimed, []int{2}) || !slices.Equal(res.CutOff, []int{2}) {
		t.Errorf("teardown of a lone host link: %v", res)
	}
	checkGone(t, m, 2)
}

// A teardown's wait for the kernel ends when its ctx does (a second
// signal): the slots whose links are still there are reported failed, to be
// quarantined, instead of the wait running to its deadline. The namespace
// here is kept alive by a socket made inside it and held outside, which no
// /proc scan sees (the descriptor reads socket:[…], not net:[…]), so the
// teardown waits for its link.
func TestTeardownWaitEndsWithCtx(t *testing.T) {
	env := nettest.New(t, 4)
	m := env.Manager(t)
	c := m.Config()
	nettest.Leak(t, m, []int{1})
	sock := make(chan int, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		fd, err := unix.Open(c.NetnsPath(1), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
		}
		s := -1
		if err == nil {
			s, _ = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		}
		sock <- s
	}()
	s := <-sock
	if s < 0 {
		t.Fatal("could not make a socket in the namespace")
	}
	t.Cleanup(func() { unix.Close(s) })
	inv, err := m.Scan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	began := time.Now()
	res := m.Teardown(ctx, inv, slot.TeardownOptions{HostGoneTimeout: 90 * time.Second})
	took := time.Since(began)
	if len(res.Failed) != 1 || res.Failed[0].Index != 1 || !errors.Is(res.Failed[0].Err, context.Canceled) {
		t.Fatalf("result %v (%v), want slot 1 failed, cut short", res, res.Err())
	}
	if took > 60*time.Second { // without the fix it waits out the 90 s deadline
		t.Fatalf("the wait took %v after its ctx ended", took)
	}
	if _, err := os.Stat(c.NetnsPath(1)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the namespace file is still there: %v", err)
	}
}
