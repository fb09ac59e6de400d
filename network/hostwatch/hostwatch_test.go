package hostwatch_test

import (
	"context"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/hostwatch"
)

// watchIn runs Watch in a network namespace of its own, made for the
// test, and returns a handle to make links there and the channel its
// reports arrive on.
func watchIn(t *testing.T, o hostwatch.Options) (*netlink.Handle, <-chan struct{}) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace of its own")
	}
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan struct{}, 16)
	ready := make(chan vns.NsHandle, 1)
	ended := make(chan error, 1)
	go func() {
		// This thread enters a namespace of its own and is never handed
		// back to Go: it ends with the goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ended <- err
			close(ready)
			return
		}
		ns, err := vns.Get()
		if err != nil {
			ended <- err
			close(ready)
			return
		}
		ready <- ns
		ended <- hostwatch.Watch(ctx, o, func(context.Context) { reports <- struct{}{} })
	}()
	ns, ok := <-ready
	if !ok {
		cancel()
		t.Fatal(<-ended)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-ended; err != nil {
			t.Errorf("Watch: %v", err)
		}
		h.Close()
		ns.Close()
	})
	time.Sleep(50 * time.Millisecond) // Watch joins its groups
	return h, reports
}

// addLink adds an up veth pair name, peer with address addr (CIDR) on
// name through h.
func addLink(t *testing.T, h *netlink.Handle, name, peer, addr string) {
	t.Helper()
	l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}
	if err := h.LinkAdd(l); err != nil {
		t.Fatal(err)
	}
	ip, ipnet, err := net.ParseCIDR(addr)
	if err != nil {
		t.Fatal(err)
	}
	ipnet.IP = ip
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipnet}); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
}

// reported waits up to d for a report.
func reported(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// The host's own link, address and route are reported once they settle,
// as one report; the caller's own links, their addresses and routes are
// not reported at all.
func TestWatchReportsTheHostsChangesNotOurs(t *testing.T) {
	o := hostwatch.Options{Ours: func(name string) bool { return len(name) > 3 && name[:3] == "pg-" },
		Settle: 100 * time.Millisecond, Every: 200 * time.Millisecond}
	h, reports := watchIn(t, o)

	addLink(t, h, "pg-h1", "pg-p1", "198.18.0.0/31")
	addLink(t, h, "pg-h2", "pg-p2", "198.18.0.2/31")
	if reported(reports, 500*time.Millisecond) {
		t.Error("the caller's own links, addresses and routes were reported")
	}

	addLink(t, h, "vpn0", "vpn1", "198.18.0.100/24")
	if !reported(reports, 2*time.Second) {
		t.Fatal("a link of the host, with an address and a route, was not reported")
	}
	if reported(reports, 500*time.Millisecond) {
		t.Error("one burst of changes was reported more than once")
	}
	vpn, err := h.LinkByName("vpn0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkDel(vpn); err != nil {
		t.Fatal(err)
	}
	if !reported(reports, 2*time.Second) {
		t.Error("the host's link deleted was not reported")
	}
}
