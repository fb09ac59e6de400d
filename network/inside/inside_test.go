package inside_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/inside"
	"github.com/phasegate/phasegate/network/internal/fakehost"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/nft"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// Two far ends in the fake outside network, both in TEST-NET-1, which
// egress.DefaultAlwaysDeny holds: a policy must allow them to be reached.
var (
	farA = netip.MustParseAddr("192.0.2.2") // the outside's own uplink address
	farB = netip.MustParseAddr("192.0.2.3") // a second address on it
)

const echoPort = 7000

// net builds a fake host with one slot, masquerading, and two echo
// servers outside (farA, farB). It returns the host and the slot's
// inside.Slot (its descriptor closed at the end of the test).
func network(t *testing.T) (*fakehost.Host, inside.Slot) {
	t.Helper()
	h := fakehost.New(t, 1, true)
	// The host's slot table lets slots reach one port of the host: the
	// proxy's, and TestGuestNAT's way out.
	h.SlotTable(t, nft.WithIsolation(nft.Isolation{HostTCPPorts: []uint16{proxyPort}}))
	addAddr(t, h.Outside, "eth0", netip.PrefixFrom(farB, 24))
	for _, a := range []netip.Addr{farA, farB} {
		echo(t, h.Outside, netip.AddrPortFrom(a, echoPort))
	}
	return h, slotOf(t, h, 0)
}

func slotOf(t *testing.T, h *fakehost.Host, k int) inside.Slot {
	t.Helper()
	s := h.Slots[k]
	fd, err := netns.Open(s.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return inside.Slot{NetnsFD: fd, Uplink: s.InsideIf, Inside: s.InsideAddr.Addr(), Gateway: s.HostAddr.Addr()}
}

func nsHandle(t *testing.T, path string) *netlink.Handle {
	t.Helper()
	fd, err := netns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func addAddr(t *testing.T, path, dev string, p netip.Prefix) {
	t.Helper()
	h := nsHandle(t, path)
	l, err := h.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}}); err != nil {
		t.Fatalf("address %s on %s: %v", p, dev, err)
	}
}

// echo serves a line echo at addr in the namespace at path until the test
// ends; it reports each connection's remote address on the returned
// channel.
func echo(t *testing.T, path string, addr netip.AddrPort) <-chan netip.Addr {
	t.Helper()
	ln, err := fakehost.ListenTCP(path, addr)
	if err != nil {
		t.Fatal(err)
	}
	peers := make(chan netip.Addr, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case peers <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap():
			default:
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return peers
}

// dial connects from the namespace at path; a refused or silent
// destination fails within wait.
func dial(t *testing.T, path string, to netip.Addr, port int, wait time.Duration) (net.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c, err := fakehost.DialTCP(ctx, path, netip.AddrPortFrom(to, uint16(port)))
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// roundTrip sends a line on c and checks that it comes back.
func roundTrip(c net.Conn, line string) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(c, line); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return fmt.Errorf("echo: got %q, want %q", got, line)
	}
	return nil
}

func drops(t *testing.T, s inside.Slot) uint64 {
	t.Helper()
	n, err := inside.Drops(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

var defaults = egress.Defaults{AlwaysDeny: egress.DefaultAlwaysDeny}

func mustPolicy(t *testing.T, allow, deny []string, denyAll bool) egress.Policy {
	t.Helper()
	p, err := egress.Parse(allow, deny, denyAll, false)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPolicyTraffic(t *testing.T) {
	h, s := network(t)
	path := h.Slots[0].NetnsPath
	// Without a policy both far ends answer: the positive control of every
	// negative below.
	for _, a := range []netip.Addr{farA, farB} {
		if _, err := dial(t, path, a, echoPort, 10*time.Second); err != nil {
			t.Fatalf("no policy: %s unreachable: %v", a, err)
		}
	}
	for _, tc := range []struct {
		name       string
		policy     egress.Policy
		defaults   egress.Defaults
		reach, not netip.Addr
	}{
		{"allow wins over the always-denied default", mustPolicy(t, []string{"192.0.2.2"}, nil, false), defaults, farA, farB},
		{"deny wins over the default accept", mustPolicy(t, nil, []string{"192.0.2.3/32"}, false), egress.Defaults{}, farA, farB},
		{"allow wins over deny", mustPolicy(t, []string{"192.0.2.3"}, []string{"192.0.2.0/24"}, false), egress.Defaults{}, farB, farA},
		{"deny-all but the always-allowed", mustPolicy(t, []string{"192.0.2.2"}, nil, true),
			egress.Defaults{AlwaysAllow: []netip.Prefix{netip.MustParsePrefix("192.0.2.3/32")}}, farB, farA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := inside.ApplyPolicy(s, tc.policy, tc.defaults); err != nil {
				t.Fatal(err)
			}
			before := drops(t, s)
			if _, err := dial(t, path, tc.reach, echoPort, 10*time.Second); err != nil {
				t.Errorf("%s unreachable: %v", tc.reach, err)
			}
			if c, err := dial(t, path, tc.not, echoPort, time.Second); err == nil {
				t.Errorf("%s reached (from %s)", tc.not, c.LocalAddr())
			}
			if after := drops(t, s); after <= before {
				t.Errorf("drop counter %d -> %d: the denied connection was not counted", before, after)
			}
		})
	}
	if err := inside.ClearPolicy(s); err != nil {
		t.Fatal(err)
	}
	if _, err := dial(t, path, farB, echoPort, 10*time.Second); err != nil {
		t.Errorf("policy cleared: %s unreachable: %v", farB, err)
	}
	if n := drops(t, s); n != 0 {
		t.Errorf("no policy, drop counter %d", n)
	}
}

// TestReplaceKeepsEstablished: a connection the old policy let through
// keeps working under a new policy that denies its destination; new
// connections follow the new policy; the drop counter keeps its count.
func TestReplaceKeepsEstablished(t *testing.T) {
	h, s := network(t)
	path := h.Slots[0].NetnsPath
	if err := inside.ApplyPolicy(s, mustPolicy(t, []string{"192.0.2.2"}, nil, false), defaults); err != nil {
		t.Fatal(err)
	}
	if _, err := dial(t, path, farB, echoPort, time.Second); err == nil {
		t.Fatal("farB reached under a policy that does not allow it")
	}
	counted := drops(t, s)
	c, err := dial(t, path, farA, echoPort, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(c, "before"); err != nil {
		t.Fatal(err)
	}
	// farA denied now, farB allowed.
	if err := inside.ApplyPolicy(s, mustPolicy(t, []string{"192.0.2.3"}, []string{"192.0.2.2"}, false), defaults); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := roundTrip(c, fmt.Sprintf("after %d", i)); err != nil {
			t.Fatalf("established connection broken by the replacement: %v", err)
		}
	}
	if _, err := dial(t, path, farA, echoPort, time.Second); err == nil {
		t.Error("a new connection to farA passed the new policy")
	}
	if _, err := dial(t, path, farB, echoPort, 10*time.Second); err != nil {
		t.Errorf("farB unreachable under the new policy: %v", err)
	}
	if n := drops(t, s); n <= counted {
		t.Errorf("drop counter %d after the replacement, %d before: not kept, or the new denial not counted", n, counted)
	}
}

func TestInspect(t *testing.T) {
	_, s := network(t)
	f, err := inside.Inspect(s, inside.Guest{})
	if err != nil {
		t.Fatal(err)
	}
	if f.Fingerprint != "" || f.GuestNAT {
		t.Fatalf("empty namespace: %+v", f)
	}
	p := mustPolicy(t, []string{"8.8.8.0/24"}, []string{"240.0.0.0/4"}, false)
	if err := inside.ApplyPolicy(s, p, defaults); err != nil {
		t.Fatal(err)
	}
	if f, err = inside.Inspect(s, inside.Guest{}); err != nil {
		t.Fatal(err)
	}
	if f.Fingerprint != p.Fingerprint(defaults) {
		t.Errorf("fingerprint %q, want %q", f.Fingerprint, p.Fingerprint(defaults))
	}
	other := mustPolicy(t, []string{"8.8.4.0/24"}, nil, false)
	if other.Fingerprint(defaults) == f.Fingerprint {
		t.Errorf("two policies, one fingerprint")
	}
	g := inside.Guest{Addr: netip.MustParseAddr("169.254.0.21"), Tap: "eth0", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}
	if err := inside.EnsureGuest(s, g); err != nil {
		t.Fatal(err)
	}
	if f, err = inside.Inspect(s, g); err != nil || !f.GuestNAT || !f.TapFilter {
		t.Errorf("after EnsureGuest: %+v, %v", f, err)
	}
	if f, err = inside.Inspect(s, inside.Guest{Addr: g.Addr, Tap: g.Tap}); err != nil || f.TapFilter {
		t.Errorf("a filter with a MAC rule found as the filter without one: %+v, %v", f, err)
	}
}
