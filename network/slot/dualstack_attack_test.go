package slot_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/rawip"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/slot"
)

// drops reads the table's drop counters.
func drops(t *testing.T, d *dual) nft.Drops {
	t.Helper()
	dr, err := d.m.Firewall().Drops(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return dr
}

// sendRaw6 sends packet, a whole IPv6 packet with the source it names,
// from slot s on a raw socket, as its root (or CAP_NET_RAW) can.
func sendRaw6(t *testing.T, s *slot.Slot, packet []byte) {
	t.Helper()
	if err := in(t, s, func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, packet, 0, &unix.SockaddrInet6{Addr: [16]byte(packet[24:40])})
	}); err != nil {
		t.Fatal(err)
	}
}

// udpIn listens on UDP at in slot s (the host's namespace when s is nil).
func udpIn(t *testing.T, s *slot.Slot, at netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	listen := func() (err error) { c, err = net.ListenUDP("udp6", net.UDPAddrFromAddrPort(at)); return err }
	var err error
	if s == nil {
		err = listen()
	} else {
		err = in(t, s, listen)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// gotUDP reports whether c receives payload within wait.
func gotUDP(c *net.UDPConn, payload string, wait time.Duration) bool {
	buf := make([]byte, 1500)
	_ = c.SetReadDeadline(time.Now().Add(wait))
	for {
		n, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return false
		}
		if string(buf[:n]) == payload {
			return true
		}
	}
}

// A slot's root sending from the victim slot's IPv6 address (a raw
// packet) to a service on its own gateway has the packet dropped and
// counted before the host sees it: the service gets nothing and the
// victim no reply. The same raw path from the slot's own address is
// answered, so the rule, not the method, stops the other.
func TestDualStackSpoofedSourceIsDropped(t *testing.T) {
	d := newDual(t)
	a, v := d.attacker, d.victim
	gw := netip.AddrPortFrom(a.HostAddr6.Addr(), d.udp)
	svc := udpIn(t, nil, gw)
	go func() { // an echo service on the host
		buf := make([]byte, 1500)
		for {
			n, from, err := svc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = svc.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	own := netip.AddrPortFrom(a.InsideAddr6.Addr(), 40000)
	ownLn := udpIn(t, a, own)
	victim := netip.AddrPortFrom(v.InsideAddr6.Addr(), 40000)
	victimLn := udpIn(t, v, victim)

	sendRaw6(t, a, rawip.UDP(own, gw, []byte("own")))
	if !gotUDP(ownLn, "own", 2*time.Second) {
		t.Fatal("the slot's own raw datagram got no answer: the test cannot tell")
	}
	before := drops(t, d).Spoofed
	sendRaw6(t, a, rawip.UDP(victim, gw, []byte("spoofed")))
	if gotUDP(victimLn, "spoofed", time.Second) {
		t.Error("the victim got the answer to a datagram spoofed in its name")
	}
	if after := drops(t, d).Spoofed; after <= before {
		t.Errorf("Spoofed = %d after the spoofed datagram, %d before; want it counted", after, before)
	}
}

// A slot's root sending router advertisements (from its own address, and
// from a link-local one it gave itself, as RFC 4861 wants them) and a
// redirect to the host changes none of the host's routes nor addresses:
// the table drops them (counted) and the host end ignores them anyway.
func TestDualStackRouterAdvertisementChangesNothing(t *testing.T) {
	setHost(t, []sysctl{{"net.ipv6.conf.all.forwarding", "0"}}) // where a host takes router advertisements
	d := newDual(t)
	a := d.attacker
	host, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	hostEnd, err := host.LinkByName(a.HostIf)
	if err != nil {
		t.Fatal(err)
	}
	// The routes an advertisement makes (a default route, the prefix's)
	// are on the link it came in on.
	state := func() ([]string, []netip.Prefix) {
		routes := whole(t, func() ([]netlink.Route, error) { return host.RouteList(hostEnd, netlink.FAMILY_V6) })
		var rs []string
		for _, r := range routes {
			rs = append(rs, r.String())
		}
		slices.Sort(rs)
		return rs, addrs6(t, host, a.HostIf)
	}
	routes, addrs := state()
	ll := netip.MustParseAddr("fe80::1")
	eth0, err := handle6(t, a).LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := handle6(t, a).AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: ll.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	before := drops(t, d)
	for _, src := range []netip.Addr{a.InsideAddr6.Addr(), ll} {
		sendICMP6(t, a, src, allNodes, routerAdvert)
	}
	sendICMP6(t, a, a.InsideAddr6.Addr(), a.HostAddr6.Addr(), redirect(a.HostAddr6.Addr(), netip.MustParseAddr("2001:db8::1")))
	time.Sleep(200 * time.Millisecond)
	if r2, a2 := state(); !slices.Equal(r2, routes) || !slices.Equal(a2, addrs) {
		t.Errorf("the host's IPv6 routes on the attacker's host end or its addresses changed:\nbefore %v %v\nafter  %v %v", routes, addrs, r2, a2)
	}
	after := drops(t, d)
	if after.Router6-before.Router6 < 2 || after.Router6+after.Spoofed-before.Router6-before.Spoofed < 3 {
		t.Errorf("Drops before %+v, after %+v: want the advertisements and the redirect counted", before, after)
	}
}

// routerAdvert is a router advertisement of a default router (lifetime
// 1800 s) and of the prefix 2001:db8:6::/64 for addresses (flags L and A).
var routerAdvert = func() []byte {
	m := []byte{134, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0,
		3, 4, 64, 0xc0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}
	p := netip.MustParseAddr("2001:db8:6::").As16()
	return append(m, p[:]...)
}()

// redirect tells its receiver that dst is better reached through target.
func redirect(target, dst netip.Addr) []byte {
	m := []byte{137, 0, 0, 0, 0, 0, 0, 0}
	t16, d16 := target.As16(), dst.As16()
	return append(append(m, t16[:]...), d16[:]...)
}

// neighbourAdvert is an unsolicited neighbour advertisement (override)
// claiming target for mac.
func neighbourAdvert(target netip.Addr, mac net.HardwareAddr) []byte {
	m := []byte{136, 0, 0, 0, 0x20, 0, 0, 0}
	t16 := target.As16()
	m = append(append(m, t16[:]...), 2, 1)
	return append(m, mac...)
}

// A slot's root advertising the victim slot's IPv6 address as its own
// (unsolicited, override, to all nodes and to its gateway, from its own
// address and from the victim's, which it put on its eth0) changes
// nothing of the host's neighbour entry for the victim nor its route to
// it, and the victim keeps answering the host.
func TestDualStackNeighbourClaimChangesNothing(t *testing.T) {
	d := newDual(t)
	a, v := d.attacker, d.victim
	victimAt := serveIn(t, v, 7601)
	if err := dialOnce(victimAt); err != nil {
		t.Fatalf("the host to the victim %s: %v", victimAt, err)
	}
	entry := func(link string) net.HardwareAddr {
		l, err := netlink.LinkByName(link)
		if err != nil {
			t.Fatal(err)
		}
		ns := whole(t, func() ([]netlink.Neigh, error) { return netlink.NeighList(l.Attrs().Index, netlink.FAMILY_V6) })
		for _, n := range ns {
			if ip, _ := netip.AddrFromSlice(n.IP); ip == v.InsideAddr6.Addr() {
				return n.HardwareAddr
			}
		}
		return nil
	}
	victimMAC := entry(v.HostIf)
	if victimMAC == nil {
		t.Fatal("the host has no neighbour entry for the victim: the test cannot tell")
	}
	routeTo := func() int {
		rs, err := netlink.RouteGet(v.InsideAddr6.Addr().AsSlice())
		if err != nil || len(rs) == 0 {
			t.Fatalf("the host's route to the victim: %v %v", rs, err)
		}
		return rs[0].LinkIndex
	}
	victimRoute := routeTo()
	h := handle6(t, a)
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	// As its root can, the attacker also takes the victim's address
	// itself and advertises it from there.
	stolen := &netlink.Addr{IPNet: &net.IPNet{IP: v.InsideAddr6.Addr().AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}
	if err := h.AddrAdd(eth0, stolen); err != nil {
		t.Fatal(err)
	}
	claim := neighbourAdvert(v.InsideAddr6.Addr(), eth0.Attrs().HardwareAddr)
	for _, from := range []netip.Addr{a.InsideAddr6.Addr(), v.InsideAddr6.Addr()} {
		for _, dst := range []netip.Addr{allNodes, a.HostAddr6.Addr()} {
			sendICMP6(t, a, from, dst, claim)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if got := routeTo(); got != victimRoute {
		t.Errorf("the host's route to the victim is through link %d, was %d", got, victimRoute)
	}
	if got := entry(v.HostIf); got.String() != victimMAC.String() {
		t.Errorf("the host's entry for the victim %s is %s, was %s", v.InsideAddr6.Addr(), got, victimMAC)
	}
	if got := entry(a.HostIf); got != nil {
		t.Errorf("the host took %s for the victim's %s on the attacker's link", got, v.InsideAddr6.Addr())
	}
	if err := dialOnce(victimAt); err != nil {
		t.Errorf("the victim stopped answering the host: %v", err)
	}
}

// RepairSettings puts back a dual-stack slot's IPv6 address and default
// route a tenant deleted, names them, and leaves them alone otherwise.
func TestRepairSettingsDualStack(t *testing.T) {
	d := newDual(t)
	s := d.victim
	if rep, err := d.m.RepairSettings(s); err != nil || len(rep) != 0 {
		t.Fatalf("RepairSettings of an intact slot = %v, %v", rep, err)
	}
	h := handle6(t, s)
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrDel(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: s.InsideAddr6.Addr().AsSlice(), Mask: net.CIDRMask(127, 128)}}); err != nil {
		t.Fatal(err)
	}
	if err := h.RouteDel(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: s.HostAddr6.Addr().AsSlice(), Family: netlink.FAMILY_V6}); err != nil {
		t.Fatal(err)
	}
	rep, err := d.m.RepairSettings(s)
	if err != nil || len(rep) != 2 {
		t.Fatalf("RepairSettings = %v, %v; want the address and the route", rep, err)
	}
	if got := addrs6(t, h, "eth0"); !slices.Equal(got, []netip.Prefix{s.InsideAddr6}) || !hasDefault6(t, h, s) {
		t.Errorf("after the repair: eth0 has %v, default route %t", got, hasDefault6(t, h, s))
	}
}
