package inside_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/rawip"
	"github.com/phasegate/phasegate/network/inside"
	"github.com/phasegate/phasegate/network/internal/fakehost"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

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

// tapProbe sends, as a microVM's guest behind the slot's tap, what a
// guest kernel can put on its wire, and says what the slot took of it.
type tapProbe struct {
	t        *testing.T
	guest    string // the guest's namespace
	guestMAC net.HardwareAddr
	sh       *netlink.Handle // the slot's namespace
	at       netip.AddrPort  // the tap's own address, where ln listens
	ln       *net.UDPConn
	tapLL    netip.Addr // the tap's IPv6 link-local address, where ll6 listens
	ll6      *net.UDPConn
}

// newTapProbe listens, in slot sl, on the tap's address and on its IPv6
// link-local address: what the guest sends there never leaves the slot,
// so only the slot's rules decide (the host's own would drop a foreign
// source too, see package nft).
func newTapProbe(t *testing.T, sl slot.Slot, guest string) *tapProbe {
	gl, err := nsHandle(t, guest).LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tapProbe{t: t, guest: guest, guestMAC: gl.Attrs().HardwareAddr, sh: nsHandle(t, sl.NetnsPath),
		at: netip.AddrPortFrom(netip.MustParseAddr("169.254.0.22"), echoPort)}
	if p.ln, err = fakehost.ListenUDP(sl.NetnsPath, p.at); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.ln.Close() })
	p.tapLL = p.linkLocal()
	if err := fakehost.Do(sl.NetnsPath, func() (err error) {
		p.ll6, err = net.ListenUDP("udp6", &net.UDPAddr{IP: p.tapLL.AsSlice(), Zone: "tap0", Port: echoPort})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.ll6.Close() })
	return p
}

// linkLocal is the tap's IPv6 link-local address once it is usable.
func (p *tapProbe) linkLocal() netip.Addr {
	tap := p.tap()
	for range 100 {
		addrs, err := p.sh.AddrList(tap, netlink.FAMILY_V6)
		if err != nil {
			p.t.Fatal(err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				return ip
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.t.Fatal("the fake tap has no usable IPv6 link-local address")
	return netip.Addr{}
}

func (p *tapProbe) tap() netlink.Link {
	tap, err := p.sh.LinkByName("tap0")
	if err != nil {
		p.t.Fatal(err)
	}
	return tap
}

// send writes whole IPv4 packets from src to the tap's address, as a guest
// kernel can put any source address on its wire, and says whether one
// arrived.
func (p *tapProbe) send(src netip.Addr) bool {
	p.t.Helper()
	buf := make([]byte, 64)
	for range 20 {
		pkt := rawip.UDP(netip.AddrPortFrom(src, 4000), p.at, []byte(src.String()))
		if err := fakehost.Do(p.guest, func() error { return rawip.Send(pkt) }); err != nil {
			p.t.Fatal(err)
		}
		_ = p.ln.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if n, from, err := p.ln.ReadFromUDPAddrPort(buf); err == nil && string(buf[:n]) == src.String() {
			if from.Addr() != src {
				p.t.Fatalf("sent from %s, arrived from %s", src, from)
			}
			return true
		}
	}
	return false
}

// learns sends an ARP request for the tap's address on behalf of addr,
// and says whether the slot then holds a neighbour entry for addr on the
// tap (what a spoofed ARP poisons).
func (p *tapProbe) learns(addr netip.Addr) bool {
	p.t.Helper()
	tap := p.tap()
	_ = p.sh.NeighDel(&netlink.Neigh{LinkIndex: tap.Attrs().Index, IP: addr.AsSlice()})
	f := rawip.ARPRequest(p.guestMAC, addr, p.at.Addr())
	for range 10 {
		if err := fakehost.Do(p.guest, func() error { return rawip.SendFrame("eth0", f) }); err != nil {
			p.t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		ns, err := p.sh.NeighList(tap.Attrs().Index, netlink.FAMILY_V4)
		if err != nil {
			p.t.Fatal(err)
		}
		for _, n := range ns {
			if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == addr && n.HardwareAddr.String() == p.guestMAC.String() {
				return true
			}
		}
	}
	return false
}

// reaches6 says whether the guest's IPv6 reaches the slot's own stack: a
// datagram to the tap's link-local address, tries times.
func (p *tapProbe) reaches6(tries int) bool {
	p.t.Helper()
	buf := make([]byte, 64)
	for range tries {
		if err := fakehost.Do(p.guest, func() error {
			c, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: p.tapLL.AsSlice(), Zone: "eth0", Port: echoPort})
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
			p.t.Fatal(err)
		}
		_ = p.ll6.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, _, err := p.ll6.ReadFromUDP(buf); err == nil && string(buf[:n]) == "v6" {
			return true
		}
	}
	return false
}

// TestGuestTapFilter: the tap accepts what the guest sends from its own
// address (and MAC, when one is given), and drops the rest before the
// slot forwards or NATs it, whatever the guest puts in its frames.
func TestGuestTapFilter(t *testing.T) {
	_, s, sl, guest, guestAddr := microVM(t)
	p := newTapProbe(t, sl, guest)
	other := netip.MustParseAddr("169.254.0.99") // neither the guest's nor the slot's
	for _, tc := range []struct {
		name         string
		mac          net.HardwareAddr
		own, spoofed bool
	}{
		{"without a filter", nil, true, true},
		{"address", nil, true, false},
		{"address and the guest's MAC", p.guestMAC, true, false},
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
		if got := p.send(guestAddr.Addr()); got != tc.own {
			t.Errorf("%s: the guest's own datagram arrived = %v, want %v", tc.name, got, tc.own)
		}
		if got := p.send(other); got != tc.spoofed {
			t.Errorf("%s: a datagram from %s arrived = %v, want %v", tc.name, other, got, tc.spoofed)
		}
		if got := p.learns(other); got != tc.spoofed {
			t.Errorf("%s: the slot learned %s from the guest's ARP = %v, want %v", tc.name, other, got, tc.spoofed)
		}
		// The guest's IPv6 reaches the slot's stack only without the
		// filter (the guest network is IPv4).
		tries := 3
		if g.Tap == "" {
			tries = 25 // the guest's own address may still be tentative
		}
		if got := p.reaches6(tries); got != (g.Tap == "") {
			t.Errorf("%s: the guest's IPv6 datagram to the tap's link-local address arrived = %v, want %v", tc.name, got, g.Tap == "")
		}
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
