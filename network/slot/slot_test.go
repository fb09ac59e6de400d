package slot_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
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
	"github.com/phasegate/phasegate/network/internal/osthread"
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

// RepairHost finds a slot as it was left and touches nothing; one whose
// host link was set down and lost its address gets both back, its
// namespace untouched. It no longer lists the host's addresses (a dump that
// a busy host interrupts, and quadratic over a restore): adding the address
// says whether it was there.
func TestRepairHost(t *testing.T) {
	env := nettest.New(t, 4)
	m := env.Manager(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, 2); err != nil {
		t.Fatal(err)
	}
	s, err := m.Lookup(2)
	if err != nil {
		t.Fatal(err)
	}
	if repaired, err := m.RepairHost(s); err != nil || len(repaired) != 0 {
		t.Fatalf("RepairHost of an intact slot: %v, %v; want nothing repaired", repaired, err)
	}
	link, err := netlink.LinkByName(s.HostIf)
	if err != nil {
		t.Fatal(err)
	}
	addrs := hostAddrs(t, link, netlink.FAMILY_V4)
	if len(addrs) != 1 {
		t.Fatalf("addresses of %s: %v", s.HostIf, addrs)
	}
	if err := netlink.AddrDel(link, &addrs[0]); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetDown(link); err != nil {
		t.Fatal(err)
	}
	repaired, err := m.RepairHost(s)
	if err != nil || !slices.Equal(repaired, []string{"link up", "address " + s.HostAddr.String()}) {
		t.Fatalf("RepairHost of a slot down without its address: %v, %v", repaired, err)
	}
	checkSlot(t, m, s)
}

// Identify says a slot is the recorded one only when both its namespace
// and its host link have the recorded identity, and says which differs
// otherwise, without touching anything.
func TestIdentify(t *testing.T) {
	env := nettest.New(t, 4)
	m := env.Manager(t)
	ctx := context.Background()
	s, err := m.Create(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	other := netns.ID{Dev: s.NetnsID.Dev, Ino: s.NetnsID.Ino + 1}
	tests := []struct {
		name    string
		ns      netns.ID
		ifindex int
		index   int
		want    string // "" for the slot; else a part of the ErrGone message
	}{
		{"as recorded", s.NetnsID, s.HostIfIndex, 3, ""},
		{"namespace made again", other, s.HostIfIndex, 3, "not the one recorded (made again since)"},
		{"host link made again", s.NetnsID, s.HostIfIndex + 100000, 3, fmt.Sprintf("host link %s is not the one recorded (index %d", s.HostIf, s.HostIfIndex)},
		{"never made", s.NetnsID, s.HostIfIndex, 4, "namespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := m.Identify(tt.index, tt.ns, tt.ifindex)
			if tt.want == "" {
				if err != nil || got.NetnsID != s.NetnsID || got.HostIfIndex != s.HostIfIndex || got.HostIf != s.HostIf {
					t.Fatalf("Identify = %+v, %v; want slot %d as created", got, err, s.Index)
				}
				return
			}
			if !errors.Is(err, slot.ErrGone) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Identify = %+v, %v; want ErrGone saying %q", got, err, tt.want)
			}
		})
	}
	// Its host link deleted: gone, whatever the namespace says.
	link, err := netlink.LinkByIndex(s.HostIfIndex)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(link); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Identify(3, s.NetnsID, s.HostIfIndex); !errors.Is(err, slot.ErrGone) || !strings.Contains(err.Error(), "host link "+s.HostIf) {
		t.Fatalf("Identify after the host link was deleted: %v; want ErrGone naming the link", err)
	}
}

// The host end of a slot has no IPv6 address and no IPv6 route in any
// table: each one would make every slot's neighbour and multicast traffic
// cost a walk over all the slots' routes (see quietIPv6). The inside end
// keeps IPv6.
func TestHostEndHasNoIPv6(t *testing.T) {
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Skip("no IPv6 in this kernel")
	}
	env := nettest.New(t, 2)
	m := env.Manager(t)
	s, err := m.Create(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	host, err := netlink.LinkByIndex(s.HostIfIndex)
	if err != nil {
		t.Fatal(err)
	}
	// Duplicate address detection would add the link-local address within
	// a second of the link coming up; give it that second.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if addrs := hostAddrs(t, host, netlink.FAMILY_V6); len(addrs) > 0 {
			t.Fatalf("IPv6 addresses on the host end %s: %v", s.HostIf, addrs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// In every table: the per-device multicast route (ff00::/8, table
	// local) costs as much as the link-local one.
	var routes []netlink.Route
	hostDump(t, "IPv6 routes", func() (err error) {
		routes, err = netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{LinkIndex: s.HostIfIndex, Table: unix.RT_TABLE_UNSPEC},
			netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
		return err
	})
	if len(routes) > 0 {
		t.Errorf("IPv6 routes through the host end %s: %v", s.HostIf, routes)
	}
	out, err := exec.Command("nsenter", "--net="+s.NetnsPath, "ip", "-6", "addr", "show", "dev", slot.InsideIfName).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "fe80::") {
		t.Errorf("the inside end has no IPv6 link-local address: %v\n%s", err, out)
	}
}

// hostDump runs a dump of the host's netlink tables until the kernel does
// not interrupt it: links and addresses change all the time on the host
// while other test packages run, and an interrupted dump may miss entries
// (a fresh-clone run failed TestRepairHost on one).
func hostDump(t *testing.T, what string, dump func() error) {
	t.Helper()
	var err error
	for range 20 {
		if err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		t.Fatalf("list %s on the host: %v", what, err)
	}
}

// hostAddrs lists the addresses of a host link (see hostDump).
func hostAddrs(t *testing.T, link netlink.Link, family int) []netlink.Addr {
	t.Helper()
	var addrs []netlink.Addr
	hostDump(t, "addresses of "+link.Attrs().Name, func() (err error) {
		addrs, err = netlink.AddrList(link, family)
		return err
	})
	return addrs
}

// RecreateHost puts the veth pair of a slot whose host link was deleted
// back into its namespace, with a process inside kept as it was (same
// namespace, alive, reachable again); a slot whose namespace is not the
// one given, or whose host link is there, is refused untouched.
func TestRecreateHost(t *testing.T) {
	env := nettest.New(t, 4)
	m, err := slot.NewManager(context.Background(), env.Config, slot.Options{Stamp: "0123456789abcdef"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := m.Create(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	inside := nettest.StartInside(t, s.NetnsPath)
	echo := listenIn(t, s.NetnsPath, s.InsideAddr.Addr())
	if err := m.RecreateHost(ctx, s); err == nil || errors.Is(err, slot.ErrGone) {
		t.Fatalf("RecreateHost of an intact slot: %v; want a refusal naming its host link", err)
	}
	old := s.HostIfIndex
	link, err := netlink.LinkByIndex(old)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(link); err != nil {
		t.Fatal(err)
	}
	wrong := *s
	wrong.NetnsID.Ino++
	if err := m.RecreateHost(ctx, &wrong); !errors.Is(err, slot.ErrGone) {
		t.Fatalf("RecreateHost of another namespace: %v; want ErrGone", err)
	}
	if err := m.RecreateHost(ctx, s); err != nil {
		t.Fatal(err)
	}
	if s.HostIfIndex == old || s.HostIfIndex == 0 {
		t.Fatalf("host ifindex %d after the repair (was %d)", s.HostIfIndex, old)
	}
	checkSlot(t, m, s)
	if id, err := netns.Stat(s.NetnsPath); err != nil || id != s.NetnsID {
		t.Fatalf("namespace after the repair: %v %v, want %v", id, err, s.NetnsID)
	}
	if err := inside.Process.Signal(unix.Signal(0)); err != nil {
		t.Fatalf("the process inside: %v", err)
	}
	if _, err := m.Identify(2, s.NetnsID, s.HostIfIndex); err != nil {
		t.Fatalf("Identify after the repair: %v", err)
	}
	// The listener made before the host link went answers through the
	// new one.
	c, err := net.DialTimeout("tcp", echo.String(), 5*time.Second)
	if err != nil {
		t.Fatalf("dial inside after the repair: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo inside after the repair: %q %v", buf, err)
	}
	other, err := slot.NewManager(ctx, env.Config, slot.Options{Stamp: "fedcba9876543210"})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := other.Stamps(ctx); err != nil || st[2] != "0123456789abcdef" {
		t.Fatalf("stamps another manager sees: %v, %v; want slot 2 stamped by the first", st, err)
	}
	if st, err := m.Stamps(ctx); err != nil || len(st) != 0 {
		t.Fatalf("stamps the manager that made slot 2 sees: %v, %v; want none but its own", st, err)
	}
}

// listenIn listens on addr inside the namespace at path and echoes one
// connection.
func listenIn(t *testing.T, path string, addr netip.Addr) net.Addr {
	t.Helper()
	var l net.Listener
	var err error
	osthread.Throwaway(func() {
		var fd int
		if fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err == nil {
			l, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		}
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", path, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err == nil {
			_, _ = io.Copy(c, c)
			c.Close()
		}
	}()
	return l.Addr()
}
