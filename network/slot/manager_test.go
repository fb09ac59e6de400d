package slot_test

import (
	"context"
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// hostFlows counts the root namespace's conntrack entries to or from addr.
func hostFlows(t *testing.T, addr net.IP) int {
	t.Helper()
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		if f.Forward.SrcIP.Equal(addr) || f.Forward.DstIP.Equal(addr) {
			n++
		}
	}
	return n
}

// Create records the slot's kernel identity, and a slot made again at an
// index gets a new one and none of the host's conntrack entries of the
// slot that was there before.
func TestCreateIdentityAndConntrack(t *testing.T) {
	env := nettest.New(t, 4)
	m := env.Manager(t)
	ctx := context.Background()
	s, err := m.Create(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	id, err := netns.Stat(s.NetnsPath)
	if err != nil || id != s.NetnsID {
		t.Errorf("NetnsID = %+v, netns file says %+v (%v)", s.NetnsID, id, err)
	}
	l, err := netlink.LinkByName(s.HostIf)
	if err != nil || l.Attrs().Index != s.HostIfIndex {
		t.Errorf("HostIfIndex = %d, link says %v (%v)", s.HostIfIndex, l, err)
	}
	// A flow from the host to the slot leaves an entry in the host's table.
	inside := net.IP(s.InsideAddr.Addr().AsSlice())
	c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: inside, Port: 9})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("x"))
	c.Close()
	if hostFlows(t, inside) == 0 {
		t.Fatalf("no conntrack entry for %s on the host", inside)
	}
	if err := m.Destroy(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if hostFlows(t, inside) == 0 {
		t.Fatalf("the entry went with Destroy; this test needs it to outlive the slot")
	}
	s2, err := m.Create(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if n := hostFlows(t, inside); n != 0 {
		t.Errorf("%d host conntrack entries of the previous slot at index 3 survived Create", n)
	}
	if s2.HostIfIndex == s.HostIfIndex {
		t.Errorf("recreated slot has the same host ifindex %d", s.HostIfIndex)
	}
}

// Options: zero means zero, negative is refused.
func TestManagerOptions(t *testing.T) {
	env := nettest.New(t, 2)
	ctx := context.Background()
	if _, err := slot.NewManager(ctx, env.Config, slot.Options{HostGoneTimeout: -1}); err == nil {
		t.Errorf("negative HostGoneTimeout accepted")
	}
	if slot.DefaultOptions().HostGoneTimeout != slot.DefaultHostGoneTimeout {
		t.Errorf("DefaultOptions = %+v", slot.DefaultOptions())
	}
	// Zero: Destroy deletes a held slot's host link without waiting.
	m, err := slot.NewManager(ctx, env.Config, slot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.Create(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	nettest.StartInside(t, s.NetnsPath)
	if err := m.Destroy(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(s.HostIf); err == nil {
		t.Errorf("host link of a held slot still there after Destroy with no wait")
	}
}

// The conntrack clean-up a Create waits for is shared, and touches only
// indices without a slot: the flows of a slot in use survive the creation
// of others, and those of a slot destroyed meanwhile are gone before its
// index is made again, whichever Create's pass removed them.
func TestCreateConntrackSharedPass(t *testing.T) {
	env := nettest.New(t, 6)
	m := env.Manager(t)
	ctx := context.Background()
	if _, err := m.Survey(ctx); err != nil {
		t.Fatal(err)
	}
	flow := func(s *slot.Slot) net.IP {
		t.Helper()
		ip := net.IP(s.InsideAddr.Addr().AsSlice())
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: ip, Port: 9})
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("x"))
		c.Close()
		if hostFlows(t, ip) == 0 {
			t.Fatalf("no conntrack entry for %s on the host", ip)
		}
		return ip
	}
	live, err := m.Create(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	liveIP := flow(live)
	old, err := m.Create(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	oldIP := flow(old)
	if err := m.Destroy(ctx, 2); err != nil {
		t.Fatal(err)
	}
	// Index 3 was never used: its Create needs no pass of its own (the
	// survey saw it empty and the first pass cleared it), index 2's does.
	for _, i := range []int{3, 2} {
		if _, err := m.Create(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	if n := hostFlows(t, oldIP); n != 0 {
		t.Errorf("%d host conntrack entries of the destroyed slot 2 survived its index's Create", n)
	}
	if hostFlows(t, liveIP) == 0 {
		t.Errorf("the flow of slot 1, in use, was removed by other slots' Creates")
	}
}
