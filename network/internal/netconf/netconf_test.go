package netconf_test

import (
	"fmt"
	"math/rand/v2"
	"os/exec"
	"testing"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/netconf"
)

// TestSetForwardingOfOneLink turns forwarding on for one link of a new
// namespace and reads it back: that link forwards, the namespace's
// ip_forward and its other links stay as they were.
func TestSetForwardingOfOneLink(t *testing.T) {
	if unix.Geteuid() != 0 {
		t.Skip("needs root: makes a network namespace")
	}
	ns := fmt.Sprintf("ncft-%08x", rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v\n%s", ns, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "a"}, PeerName: "b"}); err != nil {
		t.Fatal(err)
	}
	a, err := h.LinkByName("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.LinkByName("b")
	if err != nil {
		t.Fatal(err)
	}
	c, err := netconf.Dial(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	get := func(idx int32) bool {
		t.Helper()
		on, err := netconf.Forwarding(c, idx)
		if err != nil {
			t.Fatal(err)
		}
		return on
	}
	if get(netconf.IndexAll) || get(int32(a.Attrs().Index)) {
		t.Fatal("a new namespace forwards already; the test cannot tell")
	}
	if err := netconf.SetForwarding(c, int32(a.Attrs().Index), true); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		what  string
		index int32
		want  bool
	}{
		{"link a", int32(a.Attrs().Index), true},
		{"link b", int32(b.Attrs().Index), false},
		{"ip_forward", netconf.IndexAll, false},
		{"default", netconf.IndexDefault, false},
	} {
		if got := get(w.index); got != w.want {
			t.Errorf("%s forwarding %t, want %t", w.what, got, w.want)
		}
	}
	if err := netconf.SetForwarding(c, int32(a.Attrs().Index), false); err != nil {
		t.Fatal(err)
	}
	if get(int32(a.Attrs().Index)) {
		t.Error("link a still forwards after SetForwarding(false)")
	}
	if err := netconf.SetForwarding(c, 1<<30, true); err == nil {
		t.Error("SetForwarding of a link that does not exist succeeded")
	}
}
