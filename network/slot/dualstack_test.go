package slot_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/fakehost"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/slot"
)

// randomULA is a /64 of the unique local range no other test draws
// (fd00::/8 with 56 random bits), for a test's CIDR6.
func randomULA() netip.Prefix {
	var b [16]byte
	b[0] = 0xfd
	for i := 1; i < 8; i++ {
		b[i] = byte(rand.IntN(256))
	}
	return netip.PrefixFrom(netip.AddrFrom16(b), 64)
}

// freePort is a port number nothing on the host's loopback listens on
// now, for a service a test opens on a slot's gateway.
func freePort(t *testing.T, network string) uint16 {
	t.Helper()
	var addr net.Addr
	if network == "tcp" {
		ln, err := net.Listen("tcp6", "[::1]:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = ln.Addr()
		ln.Close()
	} else {
		c, err := net.ListenPacket("udp6", "[::1]:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = c.LocalAddr()
		c.Close()
	}
	return uint16(netip.MustParseAddrPort(addr.String()).Port())
}

// dual is a dual-stack playground: a manager with CIDR6 whose table lets
// slots reach one TCP and one UDP port of their gateway, and two slots,
// the attacker's and the victim's.
type dual struct {
	m                *slot.Manager
	attacker, victim *slot.Slot
	tcp, udp         uint16
}

func newDual(t *testing.T) *dual {
	t.Helper()
	env := nettest.New(t, 4)
	env.Config.CIDR6 = randomULA()
	d := &dual{tcp: freePort(t, "tcp"), udp: freePort(t, "udp")}
	m, err := slot.NewManager(context.Background(), env.Config, slot.Options{
		Firewall: nft.Isolation{HostTCPPorts: []uint16{d.tcp}, HostUDPPorts: []uint16{d.udp}}})
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	d.m = m
	for i, p := range []**slot.Slot{&d.attacker, &d.victim} {
		if *p, err = m.Create(context.Background(), i+1); err != nil {
			t.Fatalf("Create %d: %v", i+1, err)
		}
	}
	return d
}

// in runs fn in slot s's namespace, on a thread of its own.
func in(t *testing.T, s *slot.Slot, fn func() error) error {
	t.Helper()
	fd, err := netns.Open(s.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	return netns.Do(fd, fn)
}

// handle6 is a netlink handle in slot s's namespace, closed with t.
func handle6(t *testing.T, s *slot.Slot) *netlink.Handle {
	t.Helper()
	h, _ := handleIn(t, s.NetnsPath)
	return h
}

// whole is what dump reads once a read is not interrupted by a change of
// the host's links (other tests' come and go): a hundred tries at most.
func whole[T any](t *testing.T, dump func() (T, error)) T {
	t.Helper()
	v, err := dump()
	for try := 0; errors.Is(err, netlink.ErrDumpInterrupted) && try < 100; try++ {
		v, err = dump()
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// sysctl6 reads an IPv6 setting of a host link.
func sysctl6(t *testing.T, link, key string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + link + "/" + key)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// addrs6 are the IPv6 addresses of link as prefixes.
func addrs6(t *testing.T, h *netlink.Handle, link string) []netip.Prefix {
	t.Helper()
	l, err := h.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	as := whole(t, func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_V6) })
	var out []netip.Prefix
	for _, a := range as {
		ip, _ := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		out = append(out, netip.PrefixFrom(ip, ones))
	}
	return out
}

// Each slot of a daemon with CIDR6 has a /127 beside its /31: the
// addresses on both ends and nothing else of IPv6 (no link-local), the
// IPv6 default route via its host end, and a host end deaf to router
// advertisements and redirects.
func TestDualStackAddressing(t *testing.T) {
	d := newDual(t)
	s := d.attacker
	host, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	if got := addrs6(t, host, s.HostIf); !slices.Equal(got, []netip.Prefix{s.HostAddr6}) {
		t.Errorf("host end's IPv6 addresses = %v, want %s alone", got, s.HostAddr6)
	}
	for key, want := range map[string]string{"disable_ipv6": "0", "accept_ra": "0", "accept_redirects": "0"} {
		if got := sysctl6(t, s.HostIf, key); got != want {
			t.Errorf("host end's %s = %s, want %s", key, got, want)
		}
	}
	h := handle6(t, s)
	if got := addrs6(t, h, "eth0"); !slices.Equal(got, []netip.Prefix{s.InsideAddr6}) {
		t.Errorf("eth0's IPv6 addresses = %v, want %s alone", got, s.InsideAddr6)
	}
	if got := addrs6(t, h, "lo"); !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("::1/128")}) {
		t.Errorf("lo's IPv6 addresses = %v, want ::1", got)
	}
	if !hasDefault6(t, h, s) {
		t.Errorf("no IPv6 default route via %s", s.HostAddr6.Addr())
	}
	if s.HostAddr6.Addr().Next() != s.InsideAddr6.Addr() || s.HostAddr6.Bits() != 127 || !d.m.Config().CIDR6.Contains(s.InsideAddr6.Addr()) {
		t.Errorf("slot %d's /127 = %s, %s", s.Index, s.HostAddr6, s.InsideAddr6)
	}
	if h2, _ := d.m.Config().Addrs6(2); h2.Addr() != s.InsideAddr6.Addr().Next() {
		t.Errorf("slot 2's /127 starts at %s, want %s", h2, s.InsideAddr6.Addr().Next())
	}
}

func hasDefault6(t *testing.T, h *netlink.Handle, s *slot.Slot) bool {
	t.Helper()
	routes := whole(t, func() ([]netlink.Route, error) { return h.RouteList(nil, netlink.FAMILY_V6) })
	return slices.ContainsFunc(routes, func(r netlink.Route) bool {
		g, _ := netip.AddrFromSlice(r.Gw)
		return (r.Dst == nil || r.Dst.String() == "::/0") && g == s.HostAddr6.Addr()
	})
}

// Without CIDR6 a slot has no IPv6: its host end has it disabled, and
// nothing inside has an IPv6 address, whatever the host's defaults.
func TestNoIPv6WithoutCIDR6(t *testing.T) {
	env := nettest.New(t, 2)
	setHost(t, []sysctl{{"net.ipv6.conf.default.disable_ipv6", "0"}})
	m := env.Manager(t)
	s, err := m.Create(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if s.HostAddr6.IsValid() || s.InsideAddr6.IsValid() {
		t.Errorf("slot has IPv6 addresses %s, %s", s.HostAddr6, s.InsideAddr6)
	}
	if got := sysctl6(t, s.HostIf, "disable_ipv6"); got != "1" {
		t.Errorf("host end's disable_ipv6 = %s, want 1", got)
	}
	h := handle6(t, s)
	as, err := h.AddrList(nil, netlink.FAMILY_V6)
	if err != nil || len(as) != 0 {
		t.Errorf("IPv6 addresses inside = %v, %v; want none", as, err)
	}
}

// A dual-stack slot reaches its own gateway over IPv6 (a ping, and a TCP
// connection to a port the table opens), and the host reaches the slot's
// workload; another slot's workload it cannot reach, while the host
// still can.
func TestDualStackReachAndIsolation(t *testing.T) {
	// The host forwards IPv6 (as a node whose slots reach out does), so
	// that only the table stands between the slots.
	setHost(t, []sysctl{{"net.ipv6.conf.all.forwarding", "1"}})
	d := newDual(t)
	a, v := d.attacker, d.victim
	if rtt, err := ping6(t, a, a.HostAddr6.Addr()); err != nil {
		t.Fatalf("ping of the gateway %s from slot %d: %v", a.HostAddr6.Addr(), a.Index, err)
	} else {
		t.Logf("ping6 of the gateway: %v", rtt)
	}
	gw := netip.AddrPortFrom(a.HostAddr6.Addr(), d.tcp)
	ln, err := net.Listen("tcp6", gw.String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := in(t, a, func() error { return dialOnce(gw) }); err != nil {
		t.Errorf("slot %d to its gateway %s over TCP: %v", a.Index, gw, err)
	}
	victimAt := serveIn(t, v, 7600)
	if err := in(t, a, func() error { return dialWithin(victimAt, refusedAfter) }); err == nil {
		t.Errorf("slot %d reached slot %d's %s over IPv6", a.Index, v.Index, victimAt)
	}
	if err := dialOnce(victimAt); err != nil {
		t.Errorf("the host to slot %d's %s: %v", v.Index, victimAt, err)
	}
	if dr, err := d.m.Firewall().Drops(context.Background()); err != nil || dr.SlotToSlot == 0 {
		t.Errorf("Drops = %+v, %v; want slot-to-slot counted", dr, err)
	}
}

// Dial timeouts: what a loaded machine (two cores, other tests' links
// by the thousand) needs to answer, and how long a test waits to call a
// destination unreachable.
const (
	reachWithin  = 5 * time.Second
	refusedAfter = 2 * time.Second
)

// dialOnce opens a TCP connection to at within reachWithin and closes it.
func dialOnce(at netip.AddrPort) error { return dialWithin(at, reachWithin) }

// dialWithin opens a TCP connection to at within d and closes it.
func dialWithin(at netip.AddrPort, d time.Duration) error {
	c, err := net.DialTimeout("tcp", at.String(), d)
	if err != nil {
		return err
	}
	return c.Close()
}

// serveIn accepts TCP connections on slot s's inside IPv6 address at
// port until the test ends, and returns where.
func serveIn(t *testing.T, s *slot.Slot, port uint16) netip.AddrPort {
	t.Helper()
	return serveAt(t, s.NetnsPath, netip.AddrPortFrom(s.InsideAddr6.Addr(), port))
}

// serveAt accepts TCP connections at in the namespace at path until the
// test ends, and returns where.
func serveAt(t *testing.T, path string, at netip.AddrPort) netip.AddrPort {
	t.Helper()
	var ln net.Listener
	if err := in(t, &slot.Slot{NetnsPath: path}, func() (err error) { ln, err = net.Listen("tcp6", at.String()); return err }); err != nil {
		t.Fatal(err)
	}
	fakehost.Serve(t, ln, func(c net.Conn) { c.Close() })
	return at
}

// ping6 sends an ICMPv6 echo request from slot s to dst and waits a
// second for the reply.
func ping6(t *testing.T, s *slot.Slot, dst netip.Addr) (time.Duration, error) {
	t.Helper()
	var rtt time.Duration
	err := in(t, s, func() error {
		fd, err := icmp6Socket(0, netip.Addr{})
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		id := uint16(rand.IntN(1 << 16))
		start := time.Now()
		msg := []byte{128, 0, 0, 0, byte(id >> 8), byte(id), 0, 1, 'p', 'g'}
		if err := unix.Sendto(fd, msg, 0, &unix.SockaddrInet6{Addr: dst.As16()}); err != nil {
			return fmt.Errorf("sendto %s: %w", dst, err)
		}
		buf := make([]byte, 1500)
		for {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				return fmt.Errorf("no echo reply from %s: %w", dst, err)
			}
			if n >= 8 && buf[0] == 129 && buf[4] == byte(id>>8) && buf[5] == byte(id) {
				rtt = time.Since(start)
				return nil
			}
		}
	})
	return rtt, err
}

// icmp6Socket is a raw ICMPv6 socket in the calling thread's namespace
// that sends with hop limit 255 (what neighbour discovery and router
// advertisements need), out of link ifindex for multicast when not 0,
// from src when valid, and gives up a receive after a second.
func icmp6Socket(ifindex int, src netip.Addr) (int, error) {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
	if err != nil {
		return -1, fmt.Errorf("socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6): %w", err)
	}
	tv := unix.NsecToTimeval(time.Second.Nanoseconds())
	errs := []error{
		unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, 255),
		unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS, 255),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv),
	}
	if ifindex != 0 {
		errs = append(errs, unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, ifindex))
	}
	if src.IsValid() {
		errs = append(errs, unix.Bind(fd, &unix.SockaddrInet6{Addr: src.As16(), ZoneId: uint32(ifindex)}))
	}
	if err := errors.Join(errs...); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("raw ICMPv6 socket: %w", err)
	}
	return fd, nil
}

// allNodes is ff02::1, where router advertisements and unsolicited
// neighbour advertisements go.
var allNodes = netip.MustParseAddr("ff02::1")

// sendICMP6 sends msg from slot s, as its root can, out of eth0 to dst
// (from src, when valid: an address the test put on eth0).
func sendICMP6(t *testing.T, s *slot.Slot, src, dst netip.Addr, msg []byte) {
	t.Helper()
	eth0, err := handle6(t, s).LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	ifx := eth0.Attrs().Index
	if err := in(t, s, func() error {
		fd, err := icmp6Socket(ifx, src)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, msg, 0, &unix.SockaddrInet6{Addr: dst.As16(), ZoneId: uint32(ifx)})
	}); err != nil {
		t.Fatal(err)
	}
}

// TestRepairHostDualStack: a dual-stack slot whose host end lost both its
// addresses gets both back from RepairHost (a restart's verification of
// its leases), and one found as it was left gets nothing.
func TestRepairHostDualStack(t *testing.T) {
	d := newDual(t)
	s := d.victim
	if repaired, err := d.m.RepairHost(s); err != nil || len(repaired) != 0 {
		t.Fatalf("RepairHost of an intact slot: %v, %v; want nothing repaired", repaired, err)
	}
	link, err := netlink.LinkByName(s.HostIf)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Prefix{s.HostAddr, s.HostAddr6} {
		if err := netlink.AddrDel(link, &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}}); err != nil {
			t.Fatalf("delete %s from %s: %v", a, s.HostIf, err)
		}
	}
	repaired, err := d.m.RepairHost(s)
	if want := []string{"address " + s.HostAddr.String(), "address " + s.HostAddr6.String()}; err != nil || !slices.Equal(repaired, want) {
		t.Fatalf("RepairHost of a slot without its addresses: %v, %v; want %v", repaired, err, want)
	}
	if err := dialOnce(serveIn(t, s, freePort(t, "tcp"))); err != nil {
		t.Errorf("the host does not reach the repaired slot over IPv6: %v", err)
	}
}
