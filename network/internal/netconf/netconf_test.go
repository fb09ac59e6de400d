package netconf_test

import (
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"testing"

	mnl "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/netconf"
)

// linkPair makes a namespace of the test's own, with ip_forward off, and a
// veth pair a<->b in it; it returns an rtnetlink connection there and the
// two links' indices.
func linkPair(t *testing.T) (c *mnl.Conn, h *netlink.Handle, a, b int32) {
	t.Helper()
	if unix.Geteuid() != 0 {
		t.Skip("needs root: makes a network namespace")
	}
	ns := fmt.Sprintf("ncft-%08x", rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v\n%s", ns, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	// A new namespace copies the host's IPv4 settings (ip_forward=1 on
	// any host that runs containers): the test sets its own first, which
	// turns forwarding off for the namespace's defaults too.
	if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=0").CombinedOutput(); err != nil {
		t.Fatalf("ip_forward=0 in %s: %v\n%s", ns, err, out)
	}
	fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	h, err = netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "a"}, PeerName: "b"}); err != nil {
		t.Fatal(err)
	}
	la, err := h.LinkByName("a")
	if err != nil {
		t.Fatal(err)
	}
	lb, err := h.LinkByName("b")
	if err != nil {
		t.Fatal(err)
	}
	c, err = netconf.Dial(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, h, int32(la.Attrs().Index), int32(lb.Attrs().Index)
}

// TestSetForwardingOfOneLink turns forwarding on for one link of a new
// namespace and reads it back: that link forwards, the namespace's
// ip_forward and its other links stay as they were.
func TestSetForwardingOfOneLink(t *testing.T) {
	c, _, a, b := linkPair(t)
	get := func(idx int32) bool {
		t.Helper()
		on, err := netconf.Forwarding(c, idx)
		if err != nil {
			t.Fatal(err)
		}
		return on
	}
	if get(netconf.IndexAll) || get(a) {
		t.Fatal("a new namespace forwards already; the test cannot tell")
	}
	if err := netconf.SetForwarding(c, a, true); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		what  string
		index int32
		want  bool
	}{
		{"link a", a, true},
		{"link b", b, false},
		{"ip_forward", netconf.IndexAll, false},
		{"default", netconf.IndexDefault, false},
	} {
		if got := get(w.index); got != w.want {
			t.Errorf("%s forwarding %t, want %t", w.what, got, w.want)
		}
	}
	if err := netconf.SetForwarding(c, a, false); err != nil {
		t.Fatal(err)
	}
	if get(a) {
		t.Error("link a still forwards after SetForwarding(false)")
	}
	if err := netconf.SetForwarding(c, 1<<30, true); err == nil {
		t.Error("SetForwarding of a link that does not exist succeeded")
	}
}

// TestSetLink sets several IPv4 settings of one link and its IPv6 address
// generation in one call and reads them back: the other link keeps the
// namespace's defaults, and the link comes up with no IPv6 address.
func TestSetLink(t *testing.T) {
	c, h, a, b := linkPair(t)
	before, err := netconf.Link(c, b)
	if err != nil {
		t.Fatal(err)
	}
	if before.AddrGenMode == netconf.AddrGenNone {
		t.Fatal("a new link makes no IPv6 address already; the test cannot tell")
	}
	confs := []netconf.Conf{netconf.ConfRPFilter, netconf.ConfARPIgnore, netconf.ConfARPAnnounce,
		netconf.ConfAcceptRedirects, netconf.ConfSendRedirects, netconf.ConfRouteLocalnet}
	var want []netconf.Value
	for i, v := range []uint32{1, 1, 2, 0, 0, 1} {
		want = append(want, netconf.Value{Conf: confs[i], Value: v})
	}
	if err := netconf.SetLink(c, a, want, true); err != nil {
		t.Fatal(err)
	}
	got, err := netconf.Link(c, a)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if v := got.Get(w.Conf); v != w.Value {
			t.Errorf("setting %d of link a: %d, want %d", w.Conf, v, w.Value)
		}
	}
	if got.AddrGenMode != netconf.AddrGenNone {
		t.Errorf("link a's IPv6 address generation: %d, want none (%d)", got.AddrGenMode, netconf.AddrGenNone)
	}
	after, err := netconf.Link(c, b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(after.IPv4, before.IPv4) || after.AddrGenMode != before.AddrGenMode {
		t.Errorf("link b changed: %+v, was %+v", after, before)
	}
	for _, l := range []string{"a", "b"} {
		if err := h.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: l}}); err != nil {
			t.Fatal(err)
		}
	}
	la, err := h.LinkByIndex(int(a))
	if err != nil {
		t.Fatal(err)
	}
	if v6, err := h.AddrList(la, netlink.FAMILY_V6); err != nil || len(v6) != 0 {
		t.Errorf("IPv6 addresses of link a once up: %v, %v; want none", v6, err)
	}
	if err := netconf.SetLink(c, 1<<30, want, false); err == nil {
		t.Error("SetLink of a link that does not exist succeeded")
	}
}
