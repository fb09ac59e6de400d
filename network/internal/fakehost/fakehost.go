// Package fakehost builds, for tests, a small network made only of
// namespaces the test owns.
//
// It makes a namespace that plays the host (forwarding on, so the machine's
// own forwarding setting is never touched), slots behind it (a namespace and
// a veth pair each, addressed like real slots), and a namespace that plays
// the outside network, reached through the host's uplink with a default
// route. No packet leaves these namespaces.
//
//	slot i  eth0 169.254.x.(2i-1)/31 ── <prefix>h<i> 169.254.x.(2i-2)/31  host  up0 192.0.2.1/24 ── eth0 192.0.2.2/24  outside
//
// The outside namespace has no route back to the slots: a slot reaches it
// only if the host masquerades.
package fakehost

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/slot"
)

// Addresses of the uplink between the host and the outside namespaces
// (TEST-NET-1, assigned only inside the test's namespaces).
var (
	HostUplink    = netip.MustParsePrefix("192.0.2.1/24")
	OutsideUplink = netip.MustParsePrefix("192.0.2.2/24")
)

// Host is a fake host with its slots and an outside network.
type Host struct {
	// Config names and addresses the slots (its NetnsDir holds every
	// namespace of the fake network).
	Config slot.Config
	// Path is the host namespace's file, Outside the outside namespace's.
	Path, Outside string
	// Slots are the slots, index 1 first.
	Slots []slot.Slot
}

// New builds a fake host with n slots, forwarding on (unless forwarding is
// false) and an outside network. Everything is removed at the end of the
// test, whatever happens.
func New(t testing.TB, n int, forwarding bool) *Host {
	t.Helper()
	env := nettest.New(t, n) // its sweep removes every namespace file below
	ctx := context.Background()
	cfg := env.Config
	h := &Host{Config: cfg}
	var err error
	if h.Path, err = netns.Create(ctx, cfg.NetnsDir, cfg.Prefix+"host"); err != nil {
		t.Fatal(err)
	}
	if h.Outside, err = netns.Create(ctx, cfg.NetnsDir, cfg.Prefix+"outside"); err != nil {
		t.Fatal(err)
	}
	if err := Sysctl(h.Path, "net/ipv4/ip_forward", map[bool]string{true: "1", false: "0"}[forwarding]); err != nil {
		t.Fatal(err)
	}
	hh := handle(t, h.Path)
	oh := handle(t, h.Outside)

	// Uplink: host "up0" <-> outside "eth0".
	ofd := openNS(t, h.Outside)
	if err := hh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ofd)}); err != nil {
		t.Fatalf("fakehost: uplink: %v", err)
	}
	unix.Close(ofd)
	up(t, hh, "lo", netip.Prefix{})
	up0 := up(t, hh, "up0", HostUplink)
	up(t, oh, "lo", netip.Prefix{})
	up(t, oh, "eth0", OutsideUplink)
	if err := hh.RouteAdd(&netlink.Route{LinkIndex: up0.Attrs().Index, Gw: OutsideUplink.Addr().AsSlice()}); err != nil {
		t.Fatalf("fakehost: default route: %v", err)
	}

	for i := 1; i <= n; i++ {
		s := cfg.Slot(i)
		if _, err := netns.Create(ctx, cfg.NetnsDir, s.NetnsName); err != nil {
			t.Fatal(err)
		}
		sfd := openNS(t, s.NetnsPath)
		err := hh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: s.HostIf}, PeerName: s.InsideIf, PeerNamespace: netlink.NsFd(sfd)})
		unix.Close(sfd)
		if err != nil {
			t.Fatalf("fakehost: veth of slot %d: %v", i, err)
		}
		up(t, hh, s.HostIf, s.HostAddr)
		sh := handle(t, s.NetnsPath)
		up(t, sh, "lo", netip.Prefix{})
		in := up(t, sh, s.InsideIf, s.InsideAddr)
		if err := sh.RouteAdd(&netlink.Route{LinkIndex: in.Attrs().Index, Gw: s.HostAddr.Addr().AsSlice()}); err != nil {
			t.Fatalf("fakehost: default route of slot %d: %v", i, err)
		}
		h.Slots = append(h.Slots, s)
	}
	return h
}

// SlotTable writes the slot table (package nft) with opts into the host's
// namespace, for the host's slot network, and adds the slots to it.
func (h *Host) SlotTable(t testing.TB, opts ...nft.Option) *nft.Table {
	t.Helper()
	tbl, err := nft.New(h.Config.TableName(), append([]nft.Option{nft.WithNetNS(h.Path), nft.WithSlotNetwork(h.Config.CIDR)}, opts...)...)
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
	return tbl
}

// Serve hands every connection ln accepts to handle, which closes it,
// until the test ends and closes ln.
func Serve(t testing.TB, ln net.Listener, handle func(net.Conn)) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			handle(c)
		}
	}()
}

// HostIfs returns the host ends of the slots' veths.
func (h *Host) HostIfs() []string {
	var out []string
	for _, s := range h.Slots {
		out = append(out, s.HostIf)
	}
	return out
}

func openNS(t testing.TB, path string) int {
	t.Helper()
	fd, err := netns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

func handle(t testing.TB, path string) *netlink.Handle {
	t.Helper()
	fd := openNS(t, path)
	defer unix.Close(fd)
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		t.Fatalf("fakehost: netlink handle in %s: %v", path, err)
	}
	t.Cleanup(h.Close)
	return h
}

func up(t testing.TB, h *netlink.Handle, name string, addr netip.Prefix) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("fakehost: find %s: %v", name, err)
	}
	if addr.IsValid() {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), 32)}}
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatalf("fakehost: address %s on %s: %v", addr, name, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatalf("fakehost: set %s up: %v", name, err)
	}
	return l
}

// Do runs fn on an OS thread that has entered the network namespace at
// path. Sockets fn opens belong to that namespace for their whole life, so
// they can be used from any goroutine afterwards. The thread is never
// handed back to Go: it exits with fn's goroutine.
func Do(path string, fn func() error) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fakehost: open %s: %w", path, err)
	}
	defer unix.Close(fd)
	return netns.Do(fd, fn)
}

// Sysctl writes value to /proc/sys/<key> inside the namespace at path.
func Sysctl(path, key, value string) error {
	return Do(path, func() error {
		return os.WriteFile("/proc/sys/"+key, []byte(value), 0)
	})
}

// openIn runs fn inside the namespace at path (Do) and returns what it
// opened there.
func openIn[T any](path string, fn func() (T, error)) (T, error) {
	var v T
	err := Do(path, func() (err error) {
		v, err = fn()
		return err
	})
	return v, err
}

// ListenUDP opens a UDP socket bound to addr inside the namespace at path.
func ListenUDP(path string, addr netip.AddrPort) (*net.UDPConn, error) {
	return openIn(path, func() (*net.UDPConn, error) { return net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr)) })
}

// ListenTCP opens a TCP listener bound to addr inside the namespace at path.
func ListenTCP(path string, addr netip.AddrPort) (*net.TCPListener, error) {
	return openIn(path, func() (*net.TCPListener, error) { return net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(addr)) })
}

// DialUDP opens a UDP socket inside the namespace at path, connected to to.
func DialUDP(path string, to netip.AddrPort) (*net.UDPConn, error) {
	return openIn(path, func() (*net.UDPConn, error) { return net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to)) })
}

// DialTCP connects from inside the namespace at path to to, giving up when
// ctx ends.
func DialTCP(ctx context.Context, path string, to netip.AddrPort) (net.Conn, error) {
	return openIn(path, func() (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp4", to.String())
	})
}

// withHandle runs fn with a netlink handle in the namespace at path.
func withHandle(path string, fn func(h *netlink.Handle) error) error {
	fd, err := netns.Open(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		return err
	}
	defer h.Close()
	return fn(h)
}

// Route adds a route to dst via gw inside the namespace at path.
func Route(path string, dst netip.Prefix, gw netip.Addr) error {
	return withHandle(path, func(h *netlink.Handle) error {
		r := &netlink.Route{Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)}, Gw: gw.AsSlice()}
		if err := h.RouteAdd(r); err != nil {
			return fmt.Errorf("fakehost: route %s via %s in %s: %w", dst, gw, path, err)
		}
		return nil
	})
}

// AddAddr adds addr to the link called link inside the namespace at path.
func AddAddr(path, link string, addr netip.Prefix) error {
	return withHandle(path, func(h *netlink.Handle) error {
		l, err := h.LinkByName(link)
		if err != nil {
			return fmt.Errorf("fakehost: find %s in %s: %w", link, path, err)
		}
		a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), 32)}}
		if err := h.AddrAdd(l, a); err != nil {
			return fmt.Errorf("fakehost: address %s on %s in %s: %w", addr, link, path, err)
		}
		return nil
	})
}

// UDPReaches sends datagrams from the namespace at from to the listener ln
// (bound in another namespace of the fake network) until one arrives or
// wait passes, and returns the source address the listener saw. Use it for
// a path expected to work, or with a short wait next to a positive control.
func UDPReaches(from string, ln *net.UDPConn, wait time.Duration) (netip.Addr, bool, error) {
	to := ln.LocalAddr().(*net.UDPAddr).AddrPort()
	c, err := DialUDP(from, to)
	if err != nil {
		return netip.Addr{}, false, err
	}
	defer c.Close()
	msg := fmt.Sprintf("probe %d", time.Now().UnixNano())
	buf := make([]byte, 64)
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); {
		if _, err := c.Write([]byte(msg)); err != nil {
			return netip.Addr{}, false, err
		}
		_ = ln.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		for {
			n, src, err := ln.ReadFromUDPAddrPort(buf)
			if err != nil {
				break
			}
			if string(buf[:n]) == msg {
				return src.Addr().Unmap(), true, nil
			}
		}
	}
	return netip.Addr{}, false, nil
}
