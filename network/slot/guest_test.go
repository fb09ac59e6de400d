package slot_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/inside"
	"github.com/phasegate/phasegate/network/internal/netconf"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// guestFor is the E2B guest network, or, when the playground's CIDR holds
// it (one block in 128), the same shape in a range the playgrounds never
// use.
func guestFor(cfg slot.Config) slot.Guest {
	g := slot.Guest{Tap: "tap0", Addr: netip.MustParsePrefix("169.254.0.21/30"), Gateway: netip.MustParseAddr("169.254.0.22")}
	if cfg.CIDR.Overlaps(g.Range()) {
		g.Addr, g.Gateway = netip.MustParsePrefix("169.254.254.21/30"), netip.MustParseAddr("169.254.254.22")
	}
	return g
}

func guestManager(t *testing.T, n int) (*slot.Manager, slot.Config) {
	t.Helper()
	e := nettest.New(t, n)
	cfg := e.Config
	cfg.Guest = guestFor(cfg)
	m, err := slot.NewManager(context.Background(), cfg, slot.Options{})
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	t.Cleanup(func() { _ = m.Firewall().Delete(context.Background()) })
	return m, cfg
}

func handleIn(t *testing.T, path string) (*netlink.Handle, int) {
	t.Helper()
	fd, err := netns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h, fd
}

// hostHasMAC reports whether a link of the root namespace has mac.
func hostHasMAC(t *testing.T, mac net.HardwareAddr) bool {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		t.Fatal(err)
	}
	return slices.ContainsFunc(links, func(l netlink.Link) bool { return bytes.Equal(l.Attrs().HardwareAddr, mac) })
}

func TestGuestDevice(t *testing.T) {
	m, cfg := guestManager(t, 2)
	ctx := context.Background()
	s, err := m.Create(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	h, fd := handleIn(t, s.NetnsPath)
	tap, addrs := checkTap(t, h, cfg)
	is := inside.Slot{NetnsFD: fd, Uplink: s.InsideIf, Inside: s.InsideAddr.Addr(), Gateway: s.HostAddr.Addr()}
	g := inside.Guest{Addr: cfg.Guest.Addr.Addr(), Tap: cfg.Guest.Tap}
	if f, err := inside.Inspect(is, g); err != nil || !f.GuestNAT || !f.TapFilter {
		t.Errorf("guest tables: %+v, %v", f, err)
	}
	if v6, err := h.AddrList(tap, netlink.FAMILY_V6); err != nil || len(v6) != 0 {
		t.Errorf("IPv6 addresses on the tap: %v, %v; want none (address generation off)", v6, err)
	}
	checkForwardingRepaired(t, m, s, h, fd, tap)
	after := repairKeepsAttachedTap(t, m, s, h, tap, addrs[0], is, g)

	// A tap deleted (its VM gone) is made again.
	if err := h.LinkDel(after); err != nil {
		t.Fatal(err)
	}
	if rep, err := m.RepairGuest(s); err != nil || !slices.ContainsFunc(rep, func(r string) bool { return strings.HasPrefix(r, "tap ") }) {
		t.Errorf("RepairGuest of a slot without its tap: %v, %v", rep, err)
	}
	if _, err := h.LinkByName("tap0"); err != nil {
		t.Errorf("tap not made again: %v", err)
	}

	if err := m.Destroy(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if links := nettest.HostLinks(t, cfg.Prefix); len(links) != 0 {
		t.Errorf("after Destroy the host has %v", links)
	}
	if hostHasMAC(t, slot.TapMAC(2)) {
		t.Errorf("after Destroy a link of the host has the tap's MAC")
	}
}

// checkTap checks slot 2's tap0: a persistent tap, up, with index 2's
// MAC and the guest's gateway as its one address, which it returns.
func checkTap(t *testing.T, h *netlink.Handle, cfg slot.Config) (netlink.Link, []netlink.Addr) {
	t.Helper()
	tap, err := h.LinkByName("tap0")
	if err != nil {
		t.Fatalf("no tap in the slot: %v", err)
	}
	tt, ok := tap.(*netlink.Tuntap)
	switch {
	case !ok:
		t.Fatalf("tap0 is a %s", tap.Type())
	case tt.Mode != netlink.TUNTAP_MODE_TAP || tt.NonPersist:
		t.Errorf("tap0: mode %v, non-persistent %t; want a persistent tap", tt.Mode, tt.NonPersist)
	case tap.Attrs().HardwareAddr.String() != "02:70:00:00:00:02":
		t.Errorf("tap0 MAC %s, want 02:70:00:00:00:02 (index 2)", tap.Attrs().HardwareAddr)
	case tap.Attrs().Flags&net.FlagUp == 0:
		t.Errorf("tap0 is down")
	}
	addrs, err := h.AddrList(tap, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != netip.PrefixFrom(cfg.Guest.Gateway, 30).String() {
		t.Errorf("tap0 addresses %v, want the gateway %s/30", addrs, cfg.Guest.Gateway)
	}
	return tap, addrs
}

// checkForwardingRepaired checks forwarding is on, per link, for the tap
// and the uplink, the tap's MAC is on no link of the host, RepairGuest
// repairs nothing of an intact slot, and, once the slot's own ip_forward
// is set to 0 (which turns every link's forwarding off), RepairGuest
// turns the two links' back on, per link, leaving ip_forward at 0. The
// test sets ip_forward itself: a new namespace copies the host's.
func checkForwardingRepaired(t *testing.T, m *slot.Manager, s *slot.Slot, h *netlink.Handle, fd int, tap netlink.Link) {
	t.Helper()
	nc, err := netconf.Dial(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	up, err := h.LinkByName(s.InsideIf)
	if err != nil {
		t.Fatal(err)
	}
	forwards := func(idx int) bool {
		t.Helper()
		on, err := netconf.Forwarding(nc, int32(idx))
		if err != nil {
			t.Fatal(err)
		}
		return on
	}
	if !forwards(tap.Attrs().Index) || !forwards(up.Attrs().Index) {
		t.Errorf("forwarding inside the slot: tap0 %t, %s %t; want both on", forwards(tap.Attrs().Index), s.InsideIf, forwards(up.Attrs().Index))
	}
	if hostHasMAC(t, slot.TapMAC(2)) {
		t.Errorf("the tap's MAC is on a link of the host")
	}
	if rep, err := m.RepairGuest(s); err != nil || len(rep) != 0 {
		t.Errorf("RepairGuest on an intact slot: %v, %v; want nothing repaired", rep, err)
	}
	// 1 then 0: the kernel turns every link's off only when the value
	// changes.
	if err := netns.Do(fd, func() error {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0); err != nil {
			return err
		}
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("0"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	if forwards(up.Attrs().Index) || forwards(tap.Attrs().Index) {
		t.Fatal("ip_forward=0 left a link forwarding; the test cannot tell")
	}
	if rep, err := m.RepairGuest(s); err != nil || !slices.Equal(rep, []string{"forwarding"}) {
		t.Errorf("RepairGuest of a slot whose links stopped forwarding: %v, %v; want [forwarding]", rep, err)
	}
	if !forwards(up.Attrs().Index) || !forwards(tap.Attrs().Index) {
		t.Errorf("RepairGuest left %s or tap0 not forwarding", s.InsideIf)
	}
	// Per link, through rtnetlink: the namespace's ip_forward is a
	// /proc/sys file, whose lookup walks every namespace's entry.
	if got := readInside(t, fd, "/proc/sys/net/ipv4/ip_forward"); got != "0" {
		t.Errorf("ip_forward inside the slot after RepairGuest: %q, want 0 (forwarding is set per link)", got)
	}
}

// repairKeepsAttachedTap attaches a VM monitor to the tap, removes the
// tap's address (addr) and the guest NAT, and checks RepairGuest puts
// back only what is missing, keeping the tap (same ifindex, still
// attached); it returns the tap.
func repairKeepsAttachedTap(t *testing.T, m *slot.Manager, s *slot.Slot, h *netlink.Handle, tap netlink.Link, addr netlink.Addr, is inside.Slot, g inside.Guest) netlink.Link {
	t.Helper()
	vm := attachTap(t, is.NetnsFD, "tap0")
	if err := h.AddrDel(tap, &addr); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(is.NetnsFD))
	if err != nil {
		t.Fatal(err)
	}
	c.DelTable(&nftables.Table{Name: inside.GuestTable, Family: nftables.TableFamilyIPv4})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	rep, err := m.RepairGuest(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("repaired %v", rep)
	if len(rep) == 0 {
		t.Errorf("RepairGuest repaired nothing of a tap without its address and a slot without NAT")
	}
	if f, err := inside.Inspect(is, g); err != nil || !f.GuestNAT || !f.TapFilter {
		t.Errorf("guest tables not repaired: %+v, %v", f, err)
	}
	if !slices.Contains(rep, "guest NAT") || !slices.Contains(rep, "tap filter") {
		t.Errorf("repaired %q, want the guest NAT and the tap filter named", rep)
	}
	after, err := h.LinkByName("tap0")
	if err != nil || after.Attrs().Index != tap.Attrs().Index {
		t.Errorf("the attached tap was replaced (index %d -> %v, %v)", tap.Attrs().Index, after, err)
	}
	if _, err := vm.Write(make([]byte, 14+10)); err != nil { // a frame from the "guest"
		t.Errorf("the VM's tap descriptor stopped working: %v", err)
	}
	vm.Close()
	return after
}

// readInside reads a /proc/sys file in the namespace fd.
func readInside(t *testing.T, fd int, path string) string {
	t.Helper()
	var b []byte
	if err := netns.Do(fd, func() (err error) { b, err = os.ReadFile(path); return err }); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// attachTap opens the tap the way a VM monitor does (TUNSETIFF on
// /dev/net/tun, in the tap's namespace) and returns the descriptor.
func attachTap(t *testing.T, nsfd int, name string) *os.File {
	t.Helper()
	var f *os.File
	err := netns.Do(nsfd, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		var req [unix.IFNAMSIZ + 64]byte
		copy(req[:], name)
		*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
			unix.Close(fd)
			return errno
		}
		f = os.NewFile(uintptr(fd), "/dev/net/tun")
		return nil
	})
	if err != nil {
		t.Fatalf("attach to %s: %v", name, err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestGuestConfig(t *testing.T) {
	base := slot.DefaultConfig()
	base.CIDR = netip.MustParsePrefix("169.254.128.0/19")
	ok := slot.Guest{Tap: "tap0", Addr: netip.MustParsePrefix("169.254.0.21/30"), Gateway: netip.MustParseAddr("169.254.0.22")}
	for _, tc := range []struct {
		name string
		edit func(*slot.Config)
		want string
	}{
		{"E2B's", func(c *slot.Config) {}, ""},
		{"no guest", func(c *slot.Config) { c.Guest = slot.Guest{} }, ""},
		{"tap missing", func(c *slot.Config) { c.Guest.Tap = "" }, "Guest.Tap is required"},
		{"tap eth0", func(c *slot.Config) { c.Guest.Tap = "eth0" }, "taken inside the slot"},
		{"tap too long", func(c *slot.Config) { c.Guest.Tap = "tap-0123456789ab" }, "not an interface name"},
		{"tap with a slash", func(c *slot.Config) { c.Guest.Tap = "t/0" }, "not an interface name"},
		{"IPv6 guest", func(c *slot.Config) { c.Guest.Addr = netip.MustParsePrefix("fd00::21/126") }, "want an IPv4 address"},
		{"guest a /31", func(c *slot.Config) { c.Guest.Addr = netip.MustParsePrefix("169.254.0.21/31") }, "prefix length"},
		{"guest the network", func(c *slot.Config) { c.Guest.Addr = netip.MustParsePrefix("169.254.0.20/30") }, "network's or its broadcast"},
		{"gateway outside", func(c *slot.Config) { c.Guest.Gateway = netip.MustParseAddr("169.254.0.26") }, "not a host address of the guest network"},
		{"gateway the guest", func(c *slot.Config) { c.Guest.Gateway = netip.MustParseAddr("169.254.0.21") }, "the guest's own address"},
		{"overlaps the slot CIDR", func(c *slot.Config) { c.CIDR = netip.MustParsePrefix("169.254.0.0/17") }, "overlaps the guest range 169.254.0.20/30"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			c.Guest = ok
			tc.edit(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, slot.ErrInvalidConfig)):
				t.Errorf("error %v, want ErrInvalidConfig saying %q", err, tc.want)
			}
		})
	}
}
