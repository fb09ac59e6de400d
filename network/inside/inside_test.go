package inside_test

import (
	"bufio"
	"context"
	"errors"
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
	"github.com/phasegate/phasegate/internal/rawip"
	"github.com/phasegate/phasegate/network/inside"
	"github.com/phasegate/phasegate/network/internal/fakehost"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/slot"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// Two far ends in the fake outside network, both in TEST-NET-1, which
// inside.DefaultAlwaysDeny holds: a policy must allow them to be reached.
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
	tbl, err := nft.New(h.Config.TableName(), nft.WithNetNS(h.Path), nft.WithSlotNetwork(h.Config.CIDR), nft.WithPolicy(nft.Policy{HostTCPPorts: []uint16{proxyPort}}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := tbl.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Add(ctx, h.HostIfs()...); err != nil {
		t.Fatal(err)
	}
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

var defaults = inside.Defaults{AlwaysDeny: inside.DefaultAlwaysDeny}

func mustPolicy(t *testing.T, allow, deny []string, denyAll bool) inside.Policy {
	t.Helper()
	p, err := inside.ParsePolicy(allow, deny, denyAll, false)
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
		policy     inside.Policy
		defaults   inside.Defaults
		reach, not netip.Addr
	}{
		{"allow wins over the always-denied default", mustPolicy(t, []string{"192.0.2.2"}, nil, false), defaults, farA, farB},
		{"deny wins over the default accept", mustPolicy(t, nil, []string{"192.0.2.3/32"}, false), inside.Defaults{}, farA, farB},
		{"allow wins over deny", mustPolicy(t, []string{"192.0.2.3"}, []string{"192.0.2.0/24"}, false), inside.Defaults{}, farB, farA},
		{"deny-all but the always-allowed", mustPolicy(t, []string{"192.0.2.2"}, nil, true),
			inside.Defaults{AlwaysAllow: []netip.Prefix{netip.MustParsePrefix("192.0.2.3/32")}}, farB, farA},
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

// TestGuestNAT plays the microVM with a namespace behind a veth named as
// the tap: what the host sends to the slot's inside address reaches the
// guest at its fixed address, and what the guest sends leaves with the
// slot's inside address.
func TestGuestNAT(t *testing.T) {
	h, s, sl, guest, guestAddr := microVM(t)
	if err := inside.EnsureGuest(s, inside.Guest{Addr: guestAddr.Addr(), Tap: "tap0"}); err != nil {
		t.Fatal(err)
	}
	// In: the host dials the slot's inside address; the guest answers.
	inPeers := echo(t, guest, netip.AddrPortFrom(guestAddr.Addr(), echoPort))
	c, err := dial(t, h.Path, sl.InsideAddr.Addr(), echoPort, 10*time.Second)
	if err != nil {
		t.Fatalf("host -> slot %s -> guest: %v", sl.InsideAddr.Addr(), err)
	}
	if err := roundTrip(c, "in"); err != nil {
		t.Fatal(err)
	}
	if got := <-inPeers; got != sl.HostAddr.Addr() {
		t.Errorf("guest saw %s, want the host end %s", got, sl.HostAddr.Addr())
	}
	// Out: the guest dials the host end; the host sees the slot's address.
	outPeers := echo(t, h.Path, netip.AddrPortFrom(sl.HostAddr.Addr(), proxyPort))
	c, err = dial(t, guest, sl.HostAddr.Addr(), proxyPort, 10*time.Second)
	if err != nil {
		t.Fatalf("guest -> host: %v", err)
	}
	if err := roundTrip(c, "out"); err != nil {
		t.Fatal(err)
	}
	if got := <-outPeers; got != sl.InsideAddr.Addr() {
		t.Errorf("host saw %s, want the slot's inside address %s", got, sl.InsideAddr.Addr())
	}
	// And a policy applies to the guest's traffic too (forward hook).
	if err := inside.ApplyPolicy(s, mustPolicy(t, nil, nil, true), defaults); err != nil {
		t.Fatal(err)
	}
	if _, err := dial(t, guest, farA, echoPort, time.Second); err == nil {
		t.Error("guest reached farA under deny-all")
	}
	if err := inside.ApplyPolicy(s, mustPolicy(t, []string{"192.0.2.2"}, nil, false), defaults); err != nil {
		t.Fatal(err)
	}
	if _, err := dial(t, guest, farA, echoPort, 10*time.Second); err != nil {
		t.Errorf("guest cannot reach the allowed farA: %v", err)
	}
	// With redirect_tcp the guest's connection lands on the proxy (the
	// host's listener above).
	redirect(t, s)
	c, err = dial(t, guest, farB, echoPort, 10*time.Second)
	if err != nil {
		t.Fatalf("guest -> farB redirected to the proxy: %v", err)
	}
	if err := roundTrip(c, "via the proxy"); err != nil {
		t.Fatal(err)
	}
	if got := <-outPeers; got != sl.InsideAddr.Addr() {
		t.Errorf("the proxy saw %s, want the slot's inside address %s", got, sl.InsideAddr.Addr())
	}
}

// microVM plays a microVM guest: a namespace behind a veth whose end in
// the slot is named like the tap, addressed and routed as the guest is.
func microVM(t *testing.T) (h *fakehost.Host, s inside.Slot, sl slot.Slot, guest string, guestAddr netip.Prefix) {
	t.Helper()
	h, s = network(t)
	sl = h.Slots[0]
	guestAddr = netip.MustParsePrefix("169.254.0.21/30")
	gw := netip.MustParsePrefix("169.254.0.22/30")
	guest, err := netns.Create(context.Background(), h.Config.NetnsDir, h.Config.Prefix+"guest")
	if err != nil {
		t.Fatal(err)
	}
	gfd, err := netns.Open(guest)
	if err != nil {
		t.Fatal(err)
	}
	sh := nsHandle(t, sl.NetnsPath)
	err = sh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "tap0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(gfd)})
	unix.Close(gfd)
	if err != nil {
		t.Fatal(err)
	}
	addAddr(t, sl.NetnsPath, "tap0", gw)
	up(t, sh, "tap0")
	gh := nsHandle(t, guest)
	addAddr(t, guest, "eth0", guestAddr)
	up(t, gh, "eth0")
	up(t, gh, "lo")
	if err := fakehost.Route(guest, netip.MustParsePrefix("0.0.0.0/0"), gw.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := fakehost.Sysctl(sl.NetnsPath, "net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	return h, s, sl, guest, guestAddr
}

// TestGuestTapFilter: the tap accepts what the guest sends from its own
// address (and MAC, when one is given), and drops the rest before the
// slot forwards or NATs it, whatever the guest puts in its frames.
func TestGuestTapFilter(t *testing.T) {
	_, s, sl, guest, guestAddr := microVM(t)
	gh := nsHandle(t, guest)
	gl, err := gh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	guestMAC := gl.Attrs().HardwareAddr
	other := netip.MustParseAddr("169.254.0.99") // neither the guest's nor the slot's
	// The tap's own address, in the slot: what the guest sends there never
	// leaves the slot, so only the slot's rules decide (the host's own
	// would drop a foreign source too, see package nft).
	at := netip.AddrPortFrom(netip.MustParseAddr("169.254.0.22"), echoPort)
	ln, err := fakehost.ListenUDP(sl.NetnsPath, at)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The guest writes whole IPv4 packets, as a guest kernel can put
	// any source address on its wire.
	send := func(src netip.Addr) bool {
		t.Helper()
		buf := make([]byte, 64)
		for range 20 {
			p := rawip.UDP(netip.AddrPortFrom(src, 4000), at, []byte(src.String()))
			if err := fakehost.Do(guest, func() error { return rawip.Send(p) }); err != nil {
				t.Fatal(err)
			}
			_ = ln.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			if n, from, err := ln.ReadFromUDPAddrPort(buf); err == nil && string(buf[:n]) == src.String() {
				if from.Addr() != src {
					t.Fatalf("sent from %s, arrived from %s", src, from)
				}
				return true
			}
		}
		return false
	}
	// learns sends, as the guest, an ARP request for the tap's address on
	// behalf of addr, and says whether the slot then holds a neighbour
	// entry for addr on the tap (what a spoofed ARP poisons).
	sh := nsHandle(t, sl.NetnsPath)
	learns := func(addr netip.Addr) bool {
		t.Helper()
		tap, err := sh.LinkByName("tap0")
		if err != nil {
			t.Fatal(err)
		}
		_ = sh.NeighDel(&netlink.Neigh{LinkIndex: tap.Attrs().Index, IP: addr.AsSlice()})
		f := rawip.ARPRequest(guestMAC, addr, netip.MustParseAddr("169.254.0.22"))
		for range 10 {
			if err := fakehost.Do(guest, func() error { return rawip.SendFrame("eth0", f) }); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			ns, err := sh.NeighList(tap.Attrs().Index, netlink.FAMILY_V4)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range ns {
				if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == addr && n.HardwareAddr.String() == guestMAC.String() {
					return true
				}
			}
		}
		return false
	}
	// reaches6 says whether the guest's IPv6 reaches the slot's own
	// stack: a datagram to the tap's link-local address, tries times.
	tapLL := func() netip.Addr {
		tap, err := sh.LinkByName("tap0")
		if err != nil {
			t.Fatal(err)
		}
		for range 100 {
			addrs, err := sh.AddrList(tap, netlink.FAMILY_V6)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range addrs {
				if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
					return ip
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("the fake tap has no usable IPv6 link-local address")
		return netip.Addr{}
	}()
	var ll6 *net.UDPConn
	if err := fakehost.Do(sl.NetnsPath, func() (err error) {
		ll6, err = net.ListenUDP("udp6", &net.UDPAddr{IP: tapLL.AsSlice(), Zone: "tap0", Port: echoPort})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ll6.Close()
	reaches6 := func(tries int) bool {
		t.Helper()
		buf := make([]byte, 64)
		for range tries {
			if err := fakehost.Do(guest, func() error {
				c, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: tapLL.AsSlice(), Zone: "eth0", Port: echoPort})
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write([]byte("v6"))
				return err
			}); errors.Is(err, unix.EADDRNOTAVAIL) {
				time.Sleep(200 * time.Millisecond) // the guest's own address is still tentative
				continue
			} else if err != nil {
				t.Fatal(err)
			}
			_ = ll6.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			if n, _, err := ll6.ReadFromUDP(buf); err == nil && string(buf[:n]) == "v6" {
				return true
			}
		}
		return false
	}
	for _, tc := range []struct {
		name         string
		mac          net.HardwareAddr
		own, spoofed bool
	}{
		{"without a filter", nil, true, true},
		{"address", nil, true, false},
		{"address and the guest's MAC", guestMAC, true, false},
		{"address and another MAC", net.HardwareAddr{2, 0, 0, 0, 0, 9}, false, false},
	} {
		g := inside.Guest{Addr: guestAddr.Addr(), Tap: "tap0", MAC: tc.mac}
		if tc.name == "without a filter" {
			g.Tap = ""
		}
		if err := inside.EnsureGuest(s, g); err != nil {
			t.Fatal(err)
		}
		if f, err := inside.Inspect(s, g); err != nil || f.TapFilter != (g.Tap != "") || !f.GuestNAT {
			t.Errorf("%s: Inspect = %+v, %v", tc.name, f, err)
		}
		if got := send(guestAddr.Addr()); got != tc.own {
			t.Errorf("%s: the guest's own datagram arrived = %v, want %v", tc.name, got, tc.own)
		}
		if got := send(other); got != tc.spoofed {
			t.Errorf("%s: a datagram from %s arrived = %v, want %v", tc.name, other, got, tc.spoofed)
		}
		if got := learns(other); got != tc.spoofed {
			t.Errorf("%s: the slot learned %s from the guest's ARP = %v, want %v", tc.name, other, got, tc.spoofed)
		}
		// The guest's IPv6 reaches the slot's stack only without the
		// filter (the guest network is IPv4).
		tries := 3
		if g.Tap == "" {
			tries = 25 // the guest's own address may still be tentative
		}
		if got := reaches6(tries); got != (g.Tap == "") {
			t.Errorf("%s: the guest's IPv6 datagram to the tap's link-local address arrived = %v, want %v", tc.name, got, g.Tap == "")
		}
	}
}

// proxyPort is where the tests' egress proxy listens on the fake host,
// at the slot's gateway: the one host port the fake host's slot table
// lets slots reach.
const proxyPort = echoPort + 1

func redirect(t *testing.T, s inside.Slot) {
	t.Helper()
	p, err := inside.ParsePolicy(nil, nil, false, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := inside.ApplyPolicy(s, p, inside.Defaults{AlwaysDeny: inside.DefaultAlwaysDeny, ProxyPort: proxyPort}); err != nil {
		t.Fatal(err)
	}
}

// TestRedirectTCP: new TCP connections of the namespace's own processes
// reach the proxy instead of their destination; established ones are
// left alone.
func TestRedirectTCP(t *testing.T) {
	h, s := network(t)
	sl := h.Slots[0]
	proxyPeers := echo(t, h.Path, netip.AddrPortFrom(sl.HostAddr.Addr(), proxyPort))
	if err := inside.ApplyPolicy(s, mustPolicy(t, []string{"192.0.2.2"}, nil, false), defaults); err != nil {
		t.Fatal(err)
	}
	direct, err := dial(t, sl.NetnsPath, farA, echoPort, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	redirect(t, s)
	if err := roundTrip(direct, "established before the redirect"); err != nil {
		t.Errorf("an established connection broke: %v", err)
	}
	select {
	case p := <-proxyPeers:
		t.Fatalf("the proxy got a connection from %s before any was redirected", p)
	default:
	}
	c, err := dial(t, sl.NetnsPath, farB, echoPort, 10*time.Second)
	if err != nil {
		t.Fatalf("redirected connection: %v", err)
	}
	if err := roundTrip(c, "via the proxy"); err != nil {
		t.Fatal(err)
	}
	if got := <-proxyPeers; got != sl.InsideAddr.Addr() {
		t.Errorf("the proxy saw %s, want %s", got, sl.InsideAddr.Addr())
	}
}

func up(t *testing.T, h *netlink.Handle, name string) {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
}

func TestApplyRefusesRedirectWithoutProxy(t *testing.T) {
	_, s := network(t)
	p, err := inside.ParsePolicy(nil, nil, false, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := inside.ApplyPolicy(s, p, defaults); !errors.Is(err, inside.ErrInvalidPolicy) {
		t.Errorf("redirect without a proxy: %v, want ErrInvalidPolicy", err)
	}
	if f, err := inside.Inspect(s, inside.Guest{}); err != nil || f.Fingerprint != "" {
		t.Errorf("after a refused policy: %+v, %v", f, err)
	}
}
