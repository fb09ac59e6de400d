package slot

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// A dual-stack slot attached to a container's namespace (CNI) gives the
// container's end the slot's IPv6 address and default route beside its
// IPv4 ones, and the host reaches the container over IPv6.
func TestAttachDualStack(t *testing.T) {
	cidr6 := netip.MustParsePrefix(fmt.Sprintf("fd%02x:%x:%x:%x::/64", rand.IntN(256), rand.IntN(1<<16), rand.IntN(1<<16), rand.IntN(1<<16)))
	m := testManagerWith(t, func(c *Config) { c.CIDR6 = cidr6 })
	ctx := context.Background()
	s, err := m.Create(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	path, fd, h := containerNetns(t)
	if _, err := m.Attach(ctx, s, fd, "eth0"); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	checkConfigured(t, h, "eth0", s.InsideAddr, s.HostAddr)
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V6)
	if err != nil || !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IPNet.String() == s.InsideAddr6.String() }) {
		t.Errorf("the container's IPv6 addresses: %v %v, want %s", addrs, err, s.InsideAddr6)
	}
	routes, err := h.RouteList(l, netlink.FAMILY_V6)
	if err != nil || !slices.ContainsFunc(routes, func(r netlink.Route) bool { return r.Gw.Equal(s.HostAddr6.Addr().AsSlice()) }) {
		t.Errorf("the container's IPv6 routes: %v %v, want a default via %s", routes, err, s.HostAddr6.Addr())
	}
	if _, err := m.Attached(s, fd, "eth0"); err != nil {
		t.Errorf("Attached (CHECK) of the attachment as made: %v", err)
	}
	parked, err := netlink.LinkByName(m.cfg.ParkedIfName(1))
	if err != nil {
		t.Fatal(err)
	}
	// The host's address dump is interrupted while other links change
	// (other tests'): read until one is whole.
	var as []netlink.Addr
	for try := 0; try == 0 || errors.Is(err, netlink.ErrDumpInterrupted) && try < 100; try++ {
		as, err = netlink.AddrList(parked, netlink.FAMILY_V6)
	}
	if err != nil || len(as) != 0 {
		t.Errorf("the parked host end keeps IPv6 addresses %v (%v)", as, err)
	}
	at := echoIn(t, path, s.InsideAddr6.Addr())
	c, err := net.DialTimeout("tcp", at.String(), 5*time.Second)
	if err != nil {
		t.Fatalf("the host to the container over IPv6: %v", err)
	}
	c.Close()
	if err := h.RouteDel(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: s.HostAddr6.Addr().AsSlice(), Family: netlink.FAMILY_V6}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Attached(s, fd, "eth0"); err == nil {
		t.Error("Attached (CHECK) passed with the container's IPv6 default route deleted")
	}
}
