package slot_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/slot"
)

// ForeignUses6 names the host's IPv6 addresses and routes in CIDR6 that
// are not the daemon's own slots': a link of another name with an address
// and a route there, never a slot's /127.
func TestForeignUses6(t *testing.T) {
	env := nettest.New(t, 2)
	env.Config.CIDR6 = randomULA()
	m := env.Manager(t)
	if _, err := m.Create(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if uses, err := env.Config.ForeignUses6(); err != nil || len(uses) != 0 {
		t.Fatalf("ForeignUses6 with the daemon's own slot alone = %v, %v", uses, err)
	}
	// <prefix>h0 and <prefix>h00 are no slot's (index 0, a leading
	// zero), and the test's sweep removes them.
	name := env.Config.HostIfPrefix() + "0"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "0"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}}) })
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.PrefixFrom(env.Config.CIDR6.Addr().Next().Next().Next().Next(), 120)
	route := netip.PrefixFrom(env.Config.CIDR6.Addr(), 96).Masked()
	for _, err := range []error{
		netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(120, 128)}, Flags: unix.IFA_F_NODAD}),
		netlink.LinkSetUp(l),
		netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: route.Addr().AsSlice(), Mask: net.CIDRMask(96, 128)}}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	uses, err := env.Config.ForeignUses6()
	if err != nil {
		t.Fatal(err)
	}
	want := []slot.HostUse{{Prefix: addr, Dev: name}, {Route: true, Prefix: route, Dev: name, Table: unix.RT_TABLE_MAIN}}
	for _, w := range want {
		if !slices.Contains(uses, w) {
			t.Errorf("ForeignUses6 = %v, want %v among them", uses, w)
		}
	}
	for _, u := range uses {
		if u.Dev != name {
			t.Errorf("ForeignUses6 names %v, not on %s", u, name)
		}
	}
}
