package nft_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/fakehost"
	"github.com/phasegate/phasegate/network/nft"
)

// Ports of the services in these tests (inside the test's namespaces).
const (
	portSlot      = 7001 // a tenant's service, in slot 2
	portOutside   = 7002 // a service on the outside network
	portAllowed   = 7003 // a host service offered to slots (TCP and UDP)
	portForbidden = 7004 // a host service not offered (TCP and UDP)
)

// install puts the table with policy p into the fake host and adds its slots.
func install(t *testing.T, h *fakehost.Host, p nft.Isolation) *nft.Table {
	t.Helper()
	return h.SlotTable(t, nft.WithIsolation(p))
}

// udpArrives sends one datagram from the namespace at from to "to" and
// says whether the listener got it. A datagram that does not arrive must
// have raised the drop counter picked by dropped: the test waits for that
// counter (proof that the table dropped it, not that the wait was short),
// then checks the listener got nothing.
func udpArrives(t *testing.T, tbl *nft.Table, from string, to netip.AddrPort, ln *net.UDPConn, dropped func(nft.Drops) uint64) bool {
	t.Helper()
	return udpArrivesCounted(t, func() uint64 { return dropped(drops(t, tbl)) }, from, to, ln)
}

// udpArrivesCounted is udpArrives with the drop counter read by count.
func udpArrivesCounted(t *testing.T, count func() uint64, from string, to netip.AddrPort, ln *net.UDPConn) bool {
	t.Helper()
	before := count()
	c, err := fakehost.DialUDP(from, to)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := fmt.Sprintf("hello %d", time.Now().UnixNano())
	buf := make([]byte, 64)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := c.Write([]byte(msg)); err != nil && !errors.Is(err, unix.ECONNREFUSED) {
			t.Fatalf("send to %s: %v", to, err)
		}
		if count() > before {
			_ = ln.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			for {
				n, _, err := ln.ReadFromUDPAddrPort(buf)
				if err != nil {
					return false
				}
				if string(buf[:n]) == msg {
					t.Fatalf("datagram to %s counted as dropped and delivered", to)
				}
			}
		}
		_ = ln.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, _, err := ln.ReadFromUDPAddrPort(buf)
		if err == nil && string(buf[:n]) == msg {
			return true
		}
	}
	t.Fatalf("datagram to %s neither arrived nor was counted as dropped", to)
	return false
}

// udpSource sends a datagram from the namespace at from to the listener and
// returns the source address the listener saw.
func udpSource(t *testing.T, from string, to netip.AddrPort, ln *net.UDPConn) netip.Addr {
	t.Helper()
	c, err := fakehost.DialUDP(from, to)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	for range 50 {
		if _, err := c.Write([]byte("where from")); err != nil {
			t.Fatal(err)
		}
		_ = ln.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, src, err := ln.ReadFromUDPAddrPort(buf); err == nil && string(buf[:n]) == "where from" {
			return src.Addr()
		}
	}
	t.Fatalf("no datagram from %s reached %s", from, to)
	return netip.Addr{}
}

// tcpConnects dials from the namespace at from. A connection that does not
// come up must have raised the drop counter picked by dropped: the dial is
// given up as soon as the counter moves (proof of the drop), and the test
// fails if neither happens within 10 s.
func tcpConnects(t *testing.T, tbl *nft.Table, from string, to netip.AddrPort, dropped func(nft.Drops) uint64) bool {
	t.Helper()
	return tcpConnectsCounted(t, func() uint64 { return dropped(drops(t, tbl)) }, from, to)
}

// tcpConnectsCounted is tcpConnects with the drop counter read by count.
func tcpConnectsCounted(t *testing.T, count func() uint64, from string, to netip.AddrPort) bool {
	t.Helper()
	before := count()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := fakehost.DialTCP(ctx, from, to)
		done <- result{c, err}
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			if r.err == nil {
				r.c.Close()
				return true
			}
			t.Fatalf("dial %s: %v (want a connection or a counted drop)", to, r.err)
		case <-tick.C:
			if count() > before {
				cancel()
				if r := <-done; r.err == nil {
					t.Fatalf("dial %s counted as dropped and connected", to)
				}
				return false
			}
		}
	}
}

func drops(t *testing.T, tbl *nft.Table) nft.Drops {
	t.Helper()
	d, err := tbl.Drops(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func slotToSlot(d nft.Drops) uint64 { return d.SlotToSlot }
func toHost(d nft.Drops) uint64     { return d.ToHost }
func inbound(d nft.Drops) uint64    { return d.Inbound }

// accepts serves TCP connections until the listener closes.
func accepts(t *testing.T, ln *net.TCPListener) {
	fakehost.Serve(t, ln, func(c net.Conn) { c.Close() })
}

func listenUDP(t *testing.T, path string, addr netip.AddrPort) *net.UDPConn {
	t.Helper()
	ln, err := fakehost.ListenUDP(path, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func listenTCP(t *testing.T, path string, addr netip.AddrPort) {
	t.Helper()
	ln, err := fakehost.ListenTCP(path, addr)
	if err != nil {
		t.Fatal(err)
	}
	accepts(t, ln)
}

// Slot-to-slot traffic, UDP and TCP, is dropped by default and passes with
// the opt-in; egress through masquerade works either way.
func TestSlotToSlot(t *testing.T) {
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow=%v", allow), func(t *testing.T) {
			h := fakehost.New(t, 3, true)
			tbl := install(t, h, nft.Isolation{AllowSlotToSlot: allow})
			s1, s2 := h.Slots[0], h.Slots[1]
			dst := netip.AddrPortFrom(s2.InsideAddr.Addr(), portSlot)
			ln := listenUDP(t, s2.NetnsPath, dst)
			listenTCP(t, s2.NetnsPath, dst)

			if got := udpArrives(t, tbl, s1.NetnsPath, dst, ln, slotToSlot); got != allow {
				t.Errorf("UDP slot 1 -> slot 2 arrived = %v, want %v", got, allow)
			}
			if got := tcpConnects(t, tbl, s1.NetnsPath, dst, slotToSlot); got != allow {
				t.Errorf("TCP slot 1 -> slot 2 connected = %v, want %v", got, allow)
			}
			// The slot itself still talks to the host and to the outside.
			out := netip.AddrPortFrom(fakehost.OutsideUplink.Addr(), portOutside)
			oln := listenUDP(t, h.Outside, out)
			if src := udpSource(t, s1.NetnsPath, out, oln); src != fakehost.HostUplink.Addr() {
				t.Errorf("outside saw source %s, want the host's %s (masquerade)", src, fakehost.HostUplink.Addr())
			}
			listenTCP(t, h.Outside, out)
			if !tcpConnects(t, tbl, s1.NetnsPath, out, inbound) {
				t.Errorf("TCP slot 1 -> outside failed")
			}
		})
	}
}

// A slot reaches the host's services only on the ports offered, only at its
// own gateway, and can ping its own gateway but not another slot's.
func TestSlotToHost(t *testing.T) {
	h := fakehost.New(t, 2, true)
	tbl := install(t, h, nft.Isolation{HostTCPPorts: []uint16{portAllowed}, HostUDPPorts: []uint16{portAllowed}})
	s1, s2 := h.Slots[0], h.Slots[1]
	any4 := netip.IPv4Unspecified()
	allowedUDP := listenUDP(t, h.Path, netip.AddrPortFrom(any4, portAllowed))
	forbiddenUDP := listenUDP(t, h.Path, netip.AddrPortFrom(any4, portForbidden))
	listenTCP(t, h.Path, netip.AddrPortFrom(any4, portAllowed))
	listenTCP(t, h.Path, netip.AddrPortFrom(any4, portForbidden))
	gw := s1.HostAddr.Addr()

	if !udpArrives(t, tbl, s1.NetnsPath, netip.AddrPortFrom(gw, portAllowed), allowedUDP, toHost) {
		t.Errorf("UDP to an offered port of the gateway was dropped")
	}
	if udpArrives(t, tbl, s1.NetnsPath, netip.AddrPortFrom(gw, portForbidden), forbiddenUDP, toHost) {
		t.Errorf("UDP to a port not offered arrived")
	}
	if !tcpConnects(t, tbl, s1.NetnsPath, netip.AddrPortFrom(gw, portAllowed), toHost) {
		t.Errorf("TCP to an offered port of the gateway failed")
	}
	if tcpConnects(t, tbl, s1.NetnsPath, netip.AddrPortFrom(gw, portForbidden), toHost) {
		t.Errorf("TCP to a port not offered connected")
	}
	// Offered ports, but at another address of the host: the other slot's
	// gateway, the uplink.
	for _, a := range []netip.Addr{s2.HostAddr.Addr(), fakehost.HostUplink.Addr()} {
		if udpArrives(t, tbl, s1.NetnsPath, netip.AddrPortFrom(a, portAllowed), allowedUDP, toHost) {
			t.Errorf("UDP to the offered port at %s (not the slot's gateway) arrived", a)
		}
		if tcpConnects(t, tbl, s1.NetnsPath, netip.AddrPortFrom(a, portAllowed), toHost) {
			t.Errorf("TCP to the offered port at %s (not the slot's gateway) connected", a)
		}
	}
	if !ping(t, tbl, s1.NetnsPath, gw) {
		t.Errorf("ping of the slot's own gateway failed")
	}
	if ping(t, tbl, s1.NetnsPath, s2.HostAddr.Addr()) {
		t.Errorf("ping of another slot's gateway answered")
	}

	// Inbound from the outside network to a slot is dropped (the outside
	// gets a route to the slots for this).
	if err := fakehost.Route(h.Outside, h.Config.CIDR, fakehost.HostUplink.Addr()); err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(s1.InsideAddr.Addr(), portSlot)
	ln := listenUDP(t, s1.NetnsPath, dst)
	if udpArrives(t, tbl, h.Outside, dst, ln, inbound) {
		t.Errorf("UDP from outside to a slot arrived")
	}
}

// ping sends ICMP echo requests from the namespace at from to addr over a
// raw socket and says whether a reply came; no reply must have raised the
// to-host drop counter.
func ping(t *testing.T, tbl *nft.Table, from string, addr netip.Addr) bool {
	t.Helper()
	var fd int
	err := fakehost.Do(from, func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	before := drops(t, tbl)
	to := &unix.SockaddrInet4{Addr: addr.As4()}
	for seq := range 100 {
		req := echoRequest(uint16(seq))
		if err := unix.Sendto(fd, req, 0, to); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1500)
		for {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				break
			}
			ihl := int(buf[0]&0x0f) * 4
			if n >= ihl+8 && buf[ihl] == 0 && binary.BigEndian.Uint16(buf[ihl+6:]) == uint16(seq) {
				return true // echo reply
			}
		}
		if drops(t, tbl).ToHost > before.ToHost {
			return false
		}
	}
	t.Fatalf("ping %s: no reply and no drop counted", addr)
	return false
}

func echoRequest(seq uint16) []byte {
	b := []byte{8, 0, 0, 0, 0x70, 0x67, byte(seq >> 8), byte(seq)}
	var sum uint32
	for i := 0; i < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	sum = (sum >> 16) + (sum & 0xffff)
	sum += sum >> 16
	binary.BigEndian.PutUint16(b[2:], ^uint16(sum))
	return b
}

// Ensure rewrites the rules of an existing table to a new policy and keeps
// the slots' elements.
func TestEnsureChangesPolicy(t *testing.T) {
	h := fakehost.New(t, 2, true)
	ctx := context.Background()
	tbl := install(t, h, nft.Isolation{})
	n, err := tbl.RuleCount(ctx)
	if err != nil {
		t.Fatal(err)
	}
	open, err := nft.New(h.Config.TableName(), nft.WithNetNS(h.Path), nft.WithSlotNetwork(h.Config.CIDR),
		nft.WithIsolation(nft.Isolation{AllowSlotToSlot: true, HostUDPPorts: []uint16{53, 53}}))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := open.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if m, _ := open.RuleCount(ctx); m != n {
		t.Errorf("rule count %d after a policy change, was %d", m, n)
	}
	if els, err := open.List(ctx); err != nil || len(els) != 2 {
		t.Errorf("elements after Ensure = %v, %v; want the 2 slots", els, err)
	}
	s1, s2 := h.Slots[0], h.Slots[1]
	dst := netip.AddrPortFrom(s2.InsideAddr.Addr(), portSlot)
	if !udpArrives(t, open, s1.NetnsPath, dst, listenUDP(t, s2.NetnsPath, dst), slotToSlot) {
		t.Errorf("slot-to-slot still dropped after Ensure with AllowSlotToSlot")
	}
	if _, err := nft.New("x", nft.WithIsolation(nft.Isolation{HostTCPPorts: []uint16{0}})); err == nil {
		t.Errorf("port 0 accepted")
	}
}

// A port the operator publishes with a DNAT rule of their own reaches the
// slot from outside, although inbound traffic to slots is dropped.
func TestPublishedPort(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (tools/deps.sh installs it)")
	}
	h := fakehost.New(t, 1, true)
	tbl := install(t, h, nft.Isolation{})
	s1 := h.Slots[0]
	listenTCP(t, s1.NetnsPath, netip.AddrPortFrom(s1.InsideAddr.Addr(), portSlot))
	rule := fmt.Sprintf("nft add table ip pub && nft add chain ip pub pre '{ type nat hook prerouting priority dstnat; }' && "+
		"nft add rule ip pub pre iifname up0 tcp dport 8080 dnat to %s:%d", s1.InsideAddr.Addr(), portSlot)
	if out, err := exec.Command("nsenter", "--net="+h.Path, "sh", "-c", rule).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", rule, err, out)
	}
	if !tcpConnects(t, tbl, h.Outside, netip.AddrPortFrom(fakehost.HostUplink.Addr(), 8080), inbound) {
		t.Errorf("the published port does not reach the slot")
	}
	// Without the DNAT, the same service is not reachable from outside.
	if err := fakehost.Route(h.Outside, h.Config.CIDR, fakehost.HostUplink.Addr()); err != nil {
		t.Fatal(err)
	}
	if tcpConnects(t, tbl, h.Outside, netip.AddrPortFrom(s1.InsideAddr.Addr(), portSlot), inbound) {
		t.Errorf("a slot's service is reachable from outside without a DNAT")
	}
}
