package pool_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/internal/fakehost"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
)

// state is what a tenant can change in a slot's namespace, by category,
// with the slot's own addresses and the veth's MAC-derived values replaced
// by placeholders so that slots at different indices compare equal.
type state map[string][]string

// describe reads the state of the namespace of slot s (or, if nsPath is
// set, of that namespace file instead). With skipSysctls it does not read
// the sysctls, the slow part.
func describe(t *testing.T, s *slot.Slot, nsPath string, skipSysctls ...bool) state {
	t.Helper()
	if nsPath == "" {
		nsPath = s.NetnsPath
	}
	d := &describer{t: t, st: state{}, norm: strings.NewReplacer(
		s.InsideAddr.Addr().String(), "INSIDE", s.HostAddr.Addr().String(), "GATEWAY",
		s.InsideAddr.Masked().String(), "SLOTNET")}
	fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	names := d.links(h)
	d.routing(h, names)
	d.tables(h, fd)
	d.processes(fd)
	d.inside(nsPath, len(skipSysctls) > 0 && skipSysctls[0])
	for k := range d.st {
		slices.Sort(d.st[k])
	}
	return d.st
}

// describer gathers a namespace's state, each line with the slot's own
// addresses replaced by norm.
type describer struct {
	t    *testing.T
	norm *strings.Replacer
	st   state
}

// add keeps a line of category cat.
func (d *describer) add(cat, format string, a ...any) {
	d.st[cat] = append(d.st[cat], d.norm.Replace(fmt.Sprintf(format, a...)))
}

// links reads the links and their addresses, and returns the links'
// names by index.
func (d *describer) links(h *netlink.Handle) map[int]string {
	d.t.Helper()
	links, err := h.LinkList()
	if err != nil {
		d.t.Fatal(err)
	}
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		d.add("links", "%s %s up=%v mtu=%d", a.Name, l.Type(), a.Flags&net.FlagUp != 0, a.MTU)
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			d.t.Fatal(err)
		}
		for _, ad := range addrs {
			if ad.IP.IsLinkLocalUnicast() && ad.IP.To4() == nil {
				d.add("addrs", "%s LINKLOCAL6", a.Name) // derived from the veth's random MAC
				continue
			}
			d.add("addrs", "%s %s", a.Name, ad.IPNet)
		}
	}
	return names
}

// routing reads the routes of every table, the rules and the neighbours
// (names: the links' names by index).
func (d *describer) routing(h *netlink.Handle, names map[int]string) {
	d.t.Helper()
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		d.t.Fatal(err)
	}
	for _, r := range routes {
		dst := "default"
		if r.Dst != nil {
			dst = r.Dst.String()
		}
		if r.Dst != nil && r.Dst.IP.IsLinkLocalUnicast() && r.Dst.IP.To4() == nil && r.Table == unix.RT_TABLE_LOCAL {
			dst = "LINKLOCAL6" // the local route of eth0's link-local address
		}
		d.add("routes", "table %d %s via %v dev %s type %d", r.Table, dst, r.Gw, names[r.LinkIndex], r.Type)
	}
	rules, err := h.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		d.t.Fatal(err)
	}
	for _, r := range rules {
		d.add("rules", "family %d pref %d table %d", r.Family, r.Priority, r.Table)
	}
	neigh, err := h.NeighList(0, netlink.FAMILY_ALL)
	if err != nil {
		d.t.Fatal(err)
	}
	for _, n := range neigh {
		if n.IP.IsMulticast() {
			continue // the kernel's own, for IPv6 multicast listener reports
		}
		d.add("neighbours", "%s dev %s state %#x", n.IP, names[n.LinkIndex], n.State)
	}
}

// tables reads the conntrack flows and the nftables tables.
func (d *describer) tables(h *netlink.Handle, fd int) {
	d.t.Helper()
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		d.t.Fatal(err)
	}
	for _, f := range flows {
		d.add("conntrack", "%s", f)
	}
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		d.t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		d.t.Fatal(err)
	}
	for _, tb := range tables {
		d.add("nftables", "%d %s", tb.Family, tb.Name)
	}
}

// processes reads the processes in the namespace, but this test's own.
func (d *describer) processes(fd int) {
	d.t.Helper()
	procs, err := netns.ScanProcesses()
	if incomplete := (*netns.IncompleteError)(nil); errors.As(err, &incomplete) {
		// A process this test cannot read (pid 1 of a sandboxed host) is
		// not one of the test's: the tenant's lingering process is ours,
		// and must still show below.
		d.t.Logf("process scan: %v", err)
	} else if err != nil {
		d.t.Fatal(err)
	}
	var id netns.ID
	var sb unix.Stat_t
	if err := unix.Fstat(fd, &sb); err != nil {
		d.t.Fatal(err)
	}
	id = netns.ID{Dev: sb.Dev, Ino: sb.Ino}
	for _, pid := range procs[id] {
		if pid == os.Getpid() {
			// This test's own threads enter namespaces to read them
			// (here, and the pool's fill); they are never the tenant's.
			continue
		}
		d.add("processes", "%s", netns.Comm(pid))
	}
}

// inside reads, from a thread inside the namespace at nsPath, the
// x_tables (iptables-legacy) tables and, unless skipSysctls, every sysctl
// under /proc/sys/net.
func (d *describer) inside(nsPath string, skipSysctls bool) {
	d.t.Helper()
	err := fakehost.Do(nsPath, func() error {
		if b, err := os.ReadFile("/proc/thread-self/net/ip_tables_names"); err == nil {
			for _, n := range strings.Fields(string(b)) {
				d.add("xtables", "%s", n)
			}
		}
		if skipSysctls {
			return nil
		}
		return filepath.WalkDir("/proc/sys/net", func(p string, de fs.DirEntry, err error) error {
			if err != nil || de.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil // write-only or unreadable (stable_secret)
			}
			d.add("sysctls", "%s = %s", strings.TrimPrefix(p, "/proc/sys/"), strings.Join(strings.Fields(string(b)), " "))
			return nil
		})
	})
	if err != nil {
		d.t.Fatal(err)
	}
}

// settled describes slot s once the kernel has given eth0 its IPv6
// multicast route, which it adds once the link has its carrier, after it
// came up (a fresh slot described before then differed from a warm one in
// that route alone). A slot has no IPv6 address (network/slot's settings):
// one there fails.
func settled(t *testing.T, s *slot.Slot) state {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	mcast := func(r string) bool { return strings.Contains(r, "ff00::/8 ") && strings.Contains(r, " dev eth0 ") }
	for {
		st := describe(t, s, "", true)
		if slices.ContainsFunc(st["addrs"], func(a string) bool { return strings.Contains(a, "LINKLOCAL6") || strings.Contains(a, ":") }) {
			t.Fatalf("slot %d has an IPv6 address: %v", s.Index, st["addrs"])
		}
		if slices.ContainsFunc(st["routes"], mcast) {
			return describe(t, s, "")
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot %d: eth0 has no IPv6 multicast route: %v", s.Index, st["routes"])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// diff returns the categories in which a and b differ, with the lines.
func diff(a, b state) []string {
	var out []string
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	for k := range keys {
		if !slices.Equal(a[k], b[k]) {
			var only []string
			for _, l := range a[k] {
				if !slices.Contains(b[k], l) {
					only = append(only, "-"+l)
				}
			}
			for _, l := range b[k] {
				if !slices.Contains(a[k], l) {
					only = append(only, "+"+l)
				}
			}
			out = append(out, fmt.Sprintf("%s: %v", k, only))
		}
	}
	slices.Sort(out)
	return out
}

// within runs a shell command inside the namespace at path.
func within(t *testing.T, path, cmd string) {
	t.Helper()
	out, err := exec.Command("nsenter", "--net="+path, "sh", "-c", cmd).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
}

// whereTo says where a datagram to next's inside address goes: the host's
// route and the links holding the slot's addresses, the sockets and
// addresses inside next, the lingering process's namespace, and the host's
// ruleset. A failure to deliver is otherwise a bare "connection refused".
func whereTo(next *slot.Slot, lingering int) string {
	var b strings.Builder
	show := func(title string, name string, args ...string) {
		out, err := exec.Command(name, args...).CombinedOutput()
		fmt.Fprintf(&b, "--- %s (%s %s): err=%v\n%s", title, name, strings.Join(args, " "), err, out)
	}
	in := next.InsideAddr.Addr().String()
	show("host route", "ip", "-4", "route", "get", in)
	show("host links with the slot's /31", "ip", "-4", "-o", "addr", "show", "to", next.InsideAddr.Masked().String())
	show("host neighbours", "ip", "-4", "neigh", "show", "to", in)
	show("inside next: addresses", "nsenter", "--net="+next.NetnsPath, "ip", "-4", "-o", "addr")
	show("inside next: sockets", "nsenter", "--net="+next.NetnsPath, "ss", "-uan")
	show("lingering process: addresses", "nsenter", "--net="+fmt.Sprintf("/proc/%d/ns/net", lingering), "ip", "-4", "-o", "addr")
	show("host ruleset", "nft", "list", "ruleset")
	return b.String()
}

func requireTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (tools/deps.sh installs it)", tool)
		}
	}
}

// dirtyAsATenant changes every category of slot s's namespace as a
// tenant can (each step must show in describe, so the final comparison
// cannot pass because a category is blind), opens conntrack entries, and
// leaves a process running and a socket listening inside; the process and
// the socket are returned.
func dirtyAsATenant(t *testing.T, s *slot.Slot, want state) (*exec.Cmd, *net.UDPConn) {
	t.Helper()
	steps := []struct{ cat, cmd string }{
		{"addrs", "ip addr add 192.0.2.7/24 dev eth0 && ip -6 addr add 2001:db8::7/64 dev eth0 nodad"},
		{"links", "ip link add junk0 type veth peer name junk1 && ip link set junk0 up"},
		{"routes", "ip route add 198.51.100.0/24 via " + s.HostAddr.Addr().String() + " table 100 && ip route add 203.0.113.0/24 dev eth0"},
		{"rules", "ip rule add from all lookup 100 pref 100"},
		{"neighbours", "ip neigh add 192.0.2.99 lladdr 02:00:00:00:00:01 dev eth0 nud permanent"},
		{"nftables", "nft add table inet tenant && nft add chain inet tenant out '{ type filter hook output priority 0; }' && nft add rule inet tenant out ct state new accept && iptables -A OUTPUT -j ACCEPT"},
		{"xtables", "iptables-legacy -A INPUT -j ACCEPT"},
		{"sysctls", "sysctl -qw net.ipv4.conf.all.forwarding=1 net.ipv4.ip_default_ttl=7 net.core.somaxconn=7 net.ipv6.conf.all.disable_ipv6=1"},
	}
	for _, step := range steps {
		quick := step.cat != "sysctls"
		before := describe(t, s, "", quick)
		within(t, s.NetnsPath, step.cmd)
		if slices.Equal(before[step.cat], describe(t, s, "", quick)[step.cat]) {
			t.Fatalf("%q did not show in %s", step.cmd, step.cat)
		}
	}
	// Conntrack entries inside (the tenant's ruleset turned conntrack on).
	c, err := fakehost.DialUDP(s.NetnsPath, netip.AddrPortFrom(s.HostAddr.Addr(), 9))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("x"))
	c.Close()
	// A process left running, and a socket listening inside.
	lingering := nettest.StartInside(t, s.NetnsPath)
	old, err := fakehost.ListenUDP(s.NetnsPath, netip.AddrPortFrom(netip.IPv4Unspecified(), 7300))
	if err != nil {
		t.Fatal(err)
	}
	dirty := describe(t, s, "", true)
	for _, cat := range []string{"conntrack", "processes"} {
		if slices.Equal(dirty[cat], want[cat]) {
			t.Fatalf("the tenant's %s did not show: %v", cat, dirty[cat])
		}
	}
	return lingering, old
}

// checkLingeringCutOff checks the lingering process still runs, in the old
// namespace, which has no way out: its veth is gone, so it sees nothing of
// the next owner's traffic. A datagram from the host to the next owner's
// address reaches the next owner's socket and never the old one.
func checkLingeringCutOff(t *testing.T, s, next *slot.Slot, lingering *exec.Cmd, old *net.UDPConn) {
	t.Helper()
	oldNS := fmt.Sprintf("/proc/%d/ns/net", lingering.Process.Pid)
	var sb unix.Stat_t
	if err := unix.Stat(oldNS, &sb); err != nil {
		t.Fatalf("lingering process: %v", err)
	}
	oldID := netns.ID{Dev: sb.Dev, Ino: sb.Ino}
	if oldID == next.NetnsID {
		t.Fatalf("the lingering process is in the next owner's namespace")
	}
	for _, l := range describe(t, s, oldNS, true)["links"] {
		if !strings.HasPrefix(l, "junk") && !strings.HasPrefix(l, "lo ") {
			t.Errorf("link left to the lingering process: %s (want only lo and its own junk pair)", l)
		}
	}
	if _, err := netlink.LinkByIndex(s.HostIfIndex); err == nil {
		t.Errorf("host link %d of the released slot still exists", s.HostIfIndex)
	}
	ln, err := fakehost.ListenUDP(next.NetnsPath, netip.AddrPortFrom(netip.IPv4Unspecified(), 7300))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(next.InsideAddr.Addr(), 7300))
	tx, err := net.DialUDP("udp4", nil, to)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	buf := make([]byte, 16)
	got := false
	var werr error
	for deadline := time.Now().Add(20 * time.Second); !got && time.Now().Before(deadline); {
		if _, err := tx.Write([]byte("for next")); err != nil {
			werr = err // an ICMP error from an earlier datagram; send again
		}
		_ = ln.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if n, _, err := ln.ReadFromUDP(buf); err == nil && string(buf[:n]) == "for next" {
			got = true
		}
	}
	if !got {
		t.Fatalf("the next owner did not get the datagram (last send error: %v)\n%s", werr,
			whereTo(next, lingering.Process.Pid))
	}
	_ = old.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, _, err := old.ReadFromUDP(buf); err == nil {
		t.Errorf("the lingering socket got %q meant for the next owner", buf[:n])
	}
	// A socket open in a namespace keeps it alive without a process in it,
	// which Teardown cannot see in /proc: it would wait out its timeout
	// before cutting the slot off. Close ours first.
	ln.Close()
}

// The outside review's defect B: a slot given back kept its tenant's state
// (net.ipv4.conf.all.forwarding=1, net.ipv6.conf.all.disable_ipv6=1) for the
// next owner. Here a tenant dirties its slot every way it can, leaves a
// process and a listening socket inside, and gives the slot back: the next
// slot handed out at that index must equal a freshly made slot in every
// category, and the lingering process must be cut off.
func TestReleasedSlotIsClean(t *testing.T) {
	requireTools(t, "ip", "nsenter", "sysctl", "nft", "iptables", "iptables-legacy", "sleep")
	env := nettest.New(t, 8)
	m := env.Manager(t)
	ctx := context.Background()
	st, err := index.New(7, nil) // index 8 is the fresh reference, outside the pool
	if err != nil {
		t.Fatal(err)
	}
	p, err := pool.New(m, st, pool.Options{Target: 1, Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	if err := p.WaitReady(ctx, 1); err != nil {
		t.Fatal(err)
	}
	fresh, err := m.Create(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	want := settled(t, fresh)
	s, err := p.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := diff(settled(t, s), want); len(d) != 0 {
		t.Fatalf("a warm slot differs from a fresh one before any tenant: %v", d)
	}

	// The tenant at work, leaving a process and a listening socket.
	lingering, old := dirtyAsATenant(t, s, want)
	defer old.Close()

	t0 := time.Now()
	if err := p.Put(ctx, s); err != nil {
		t.Fatalf("Put: %v", err)
	}
	t.Logf("Put of the dirty slot took %v", time.Since(t0))
	waitUntil(t, "the replacement", func() bool { sn := p.Snapshot(); return sn.Filling == 0 && len(sn.Creating) == 0 })
	next, err := p.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next.Index != s.Index {
		t.Fatalf("next slot is %d, want the replacement at %d", next.Index, s.Index)
	}
	if d := diff(settled(t, next), want); len(d) != 0 {
		t.Errorf("the next slot at index %d differs from a fresh slot:\n%s", s.Index, strings.Join(d, "\n"))
	}

	checkLingeringCutOff(t, s, next, lingering, old)
	if err := p.Put(ctx, next); err != nil {
		t.Fatal(err)
	}
}
