package slot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	mnl "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network"
	"github.com/phasegate/phasegate/network/inside"
	"github.com/phasegate/phasegate/network/internal/netconf"
	"github.com/phasegate/phasegate/network/netns"
)

// Guest is the optional guest device of every slot: a tap inside the
// namespace for a microVM whose address is the same in every slot, and
// the NAT between that address and the slot's own inside address (package
// inside). The zero Guest is none.
type Guest struct {
	// Tap is the tap's name inside the namespace ("tap0").
	Tap string
	// Addr is the guest's address with the guest network's prefix length
	// (169.254.0.21/30): what the microVM is configured with.
	Addr netip.Prefix
	// Gateway is the tap's address (169.254.0.22): the guest's default
	// route goes via it.
	Gateway netip.Addr
	// MAC, when set, is the guest's MAC (the VM monitor's option): the
	// tap then accepts frames from it only. Without it the tap accepts
	// the guest's address from any MAC; the tap is a segment of two, the
	// guest and the slot, so a MAC there names nobody else.
	MAC net.HardwareAddr
}

// Enabled reports whether slots have a guest device.
func (g Guest) Enabled() bool {
	return g.Tap != "" || g.Addr.IsValid() || g.Gateway.IsValid() || len(g.MAC) > 0
}

// Range is the guest network (169.254.0.20/30).
func (g Guest) Range() netip.Prefix { return g.Addr.Masked() }

// validate returns the guest device's problems, each naming its setting
// (a *network.SettingError: Config's field, which the daemon shows as its
// flag).
func (g Guest) validate() []*network.SettingError {
	if !g.Enabled() {
		return nil
	}
	var bad []*network.SettingError
	add := func(setting, format string, a ...any) {
		bad = append(bad, &network.SettingError{Setting: "Guest." + setting, Problem: fmt.Sprintf(format, a...)})
	}
	switch {
	case g.Tap == "":
		add("Tap", "is required with a guest device")
	case len(g.Tap) > maxIfName || strings.ContainsAny(g.Tap, "/ \t\n:") || g.Tap == "." || g.Tap == "..":
		add("Tap", "%q is not an interface name (at most %d bytes, no '/', ':' or spaces)", g.Tap, maxIfName)
	case g.Tap == InsideIfName || g.Tap == "lo":
		add("Tap", "%q is taken inside the slot", g.Tap)
	}
	if !g.Addr.IsValid() || !g.Addr.Addr().Is4() || g.Addr.Bits() > 30 || g.Addr.Bits() < 8 {
		add("Addr", "%s: want an IPv4 address with a prefix length in /8../30 (169.254.0.21/30)", g.Addr)
		return bad
	}
	r := g.Range()
	last := r.Addr()
	for range 1<<(32-r.Bits()) - 1 {
		last = last.Next()
	}
	isEdge := func(a netip.Addr) bool { return a == r.Addr() || a == last }
	if len(g.MAC) > 0 && (len(g.MAC) != 6 || g.MAC[0]&1 != 0 || bytes.Equal(g.MAC, make(net.HardwareAddr, 6))) {
		add("MAC", "%s: want a unicast Ethernet MAC (02:fc:00:00:00:01)", g.MAC)
	}
	if isEdge(g.Addr.Addr()) {
		add("Addr", "%s is the network's or its broadcast address", g.Addr)
	}
	switch {
	case !g.Gateway.IsValid() || !g.Gateway.Is4():
		add("Gateway", "%s: want an IPv4 address in %s", g.Gateway, r)
	case !r.Contains(g.Gateway) || isEdge(g.Gateway):
		add("Gateway", "%s is not a host address of the guest network %s", g.Gateway, r)
	case g.Gateway == g.Addr.Addr():
		add("Gateway", "%s is the guest's own address", g.Gateway)
	}
	return bad
}

// TapMAC is slot i's tap MAC: locally administered, unicast, 02:70 then
// the index in 4 bytes. It is the gateway's MAC the guest resolves; one
// per slot, so that a capture or a neighbour table names the slot. The
// guest's own MAC is set by the VM monitor (QEMU's or Firecracker's
// option), never by phasegate.
func TapMAC(i int) net.HardwareAddr {
	return binary.BigEndian.AppendUint32(net.HardwareAddr{0x02, 0x70}, uint32(i))
}

// insideSlot describes slot s to package inside, through the namespace
// descriptor fd.
func insideSlot(fd int, s *Slot) inside.Slot {
	return inside.Slot{NetnsFD: fd, Uplink: s.InsideIf, Inside: s.InsideAddr.Addr(), Gateway: s.HostAddr.Addr()}
}

// insideGuest is the guest as package inside writes its tables.
func (g Guest) insideGuest() inside.Guest {
	return inside.Guest{Addr: g.Addr.Addr(), Tap: g.Tap, MAC: g.MAC}
}

// makeGuest adds the guest device to a new slot: the tap with its MAC and
// the gateway address, IPv6 off on it, up; forwarding on between it and
// the slot's uplink; and the guest tables (NAT, the tap's filter).
func (m *Manager) makeGuest(fd int, s *Slot) error {
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", s.NetnsName, err)
	}
	defer h.Close()
	tap, err := m.addTap(h, fd, s)
	if err != nil {
		return err
	}
	if err := m.forwardGuest(h, fd, s, tap); err != nil {
		return err
	}
	return m.ensureGuestTables(fd, s)
}

// forwardGuest gives the tap (index tap) and the slot's uplink, the two
// links the guest's packets are routed between, a forwarding link's
// settings (insideConf), forwarding on among them, through rtnetlink: the
// namespace's ip_forward is a /proc/sys file, whose lookup walks every
// namespace's entry of that name (package netconf).
func (m *Manager) forwardGuest(h *netlink.Handle, fd int, s *Slot, tap int) error {
	_, err := onGuestLinks(h, fd, s, tap, func(c *mnl.Conn, link int32) (bool, error) {
		return true, netconf.SetLink(c, link, insideConf(true), false)
	})
	return err
}

// ensureGuestTables writes the guest tables inside slot s.
func (m *Manager) ensureGuestTables(fd int, s *Slot) error {
	if err := inside.EnsureGuest(insideSlot(fd, s), m.cfg.Guest.insideGuest()); err != nil {
		return fmt.Errorf("guest tables in %s: %w", s.NetnsName, err)
	}
	return nil
}

// addTap makes the tap (persistent, so that it outlives the VM monitor
// that opens it) and configures it, and returns its index. /dev/net/tun
// makes a tap in the namespace of the thread that opens it, whatever
// netlink handle asks, so the creating call runs on a thread inside the
// namespace (netns.Do); the rest goes through h, a handle on the
// namespace.
func (m *Manager) addTap(h *netlink.Handle, fd int, s *Slot) (int, error) {
	g := m.cfg.Guest
	tap, err := h.LinkByName(g.Tap)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		tt := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: g.Tap}, Mode: netlink.TUNTAP_MODE_TAP,
			Flags: netlink.TUNTAP_DEFAULTS | netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR}
		if err := netns.Do(fd, func() error {
			if err := netlink.LinkAdd(tt); err != nil {
				return err
			}
			for _, f := range tt.Fds {
				f.Close() // persistent: the tap stays without a descriptor
			}
			return nil
		}); err != nil {
			return 0, fmt.Errorf("add tap %s in %s: %w", g.Tap, s.NetnsName, err)
		}
		if tap, err = h.LinkByName(g.Tap); err != nil {
			return 0, fmt.Errorf("find tap %s in %s: %w", g.Tap, s.NetnsName, err)
		}
		// The guest network is IPv4, NATed: the tap gets no IPv6 address
		// of its own (so the slot says nothing on it), and the tap filter
		// drops the guest's IPv6 (inside.EnsureGuest). Before it is up.
		if err := h.LinkSetIP6AddrGenMode(tap, in6AddrGenModeNone); err != nil && ipv6Enabled() {
			return 0, fmt.Errorf("IPv6 address generation off on %s in %s: %w", g.Tap, s.NetnsName, err)
		}
		if err := h.LinkSetHardwareAddr(tap, TapMAC(s.Index)); err != nil {
			return 0, fmt.Errorf("MAC of %s in %s: %w", g.Tap, s.NetnsName, err)
		}
	case err != nil:
		return 0, fmt.Errorf("find tap %s in %s: %w", g.Tap, s.NetnsName, err)
	}
	gw := netip.PrefixFrom(g.Gateway, g.Addr.Bits())
	if err := h.AddrReplace(tap, &netlink.Addr{IPNet: ipNet(gw)}); err != nil {
		return 0, fmt.Errorf("address %s on %s in %s: %w", gw, g.Tap, s.NetnsName, err)
	}
	if err := h.LinkSetUp(tap); err != nil {
		return 0, fmt.Errorf("set %s up in %s: %w", g.Tap, s.NetnsName, err)
	}
	return tap.Attrs().Index, nil
}

// in6AddrGenModeNone is IN6_ADDR_GEN_MODE_NONE (linux/if_link.h): a link
// that makes no IPv6 address of its own, link-local included.
const in6AddrGenModeNone = 1

// GuestState is what RepairGuest found of a slot's guest device.
type GuestState struct {
	Tap, Forwarding, NAT, TapFilter bool
}

// RepairGuest puts back what a restored slot's guest device lacks — the
// tap (only when there is none: a tap that is there, a running VM's, is
// not recreated, its address only re-added if missing), forwarding inside,
// the NAT table — and returns what it repaired. A slot found whole is
// left exactly as it is. Without a guest device it does nothing.
func (m *Manager) RepairGuest(s *Slot) (repaired []string, err error) {
	if !m.cfg.Guest.Enabled() {
		return nil, nil
	}
	err = withNetns(s, func(fd int) error {
		repaired, err = m.repairGuest(fd, s)
		return err
	})
	return repaired, err
}

func (m *Manager) repairGuest(fd int, s *Slot) (repaired []string, err error) {
	st, err := m.guestState(fd, s)
	if err != nil {
		return nil, fmt.Errorf("slot %d: %w", s.Index, err)
	}
	for _, part := range []struct {
		ok   bool
		name string
	}{{st.Forwarding, "forwarding"}, {st.Tap, "tap " + m.cfg.Guest.Tap}, {st.NAT, "guest NAT"}, {st.TapFilter, "tap filter"}} {
		if !part.ok {
			repaired = append(repaired, part.name)
		}
	}
	switch {
	case !st.Forwarding || !st.Tap:
		if err := m.makeGuest(fd, s); err != nil {
			return repaired, fmt.Errorf("slot %d: repair guest device: %w", s.Index, err)
		}
	case !st.NAT || !st.TapFilter:
		if err := m.ensureGuestTables(fd, s); err != nil {
			return repaired, fmt.Errorf("slot %d: repair: %w", s.Index, err)
		}
	}
	return repaired, nil
}

// guestState reads the guest device of the slot whose namespace fd is.
func (m *Manager) guestState(fd int, s *Slot) (GuestState, error) {
	var st GuestState
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		return st, fmt.Errorf("netlink handle in %s: %w", s.NetnsName, err)
	}
	defer h.Close()
	tap, err := h.LinkByName(m.cfg.Guest.Tap)
	if err == nil {
		addrs, err := h.AddrList(tap, netlink.FAMILY_V4)
		if err != nil {
			return st, fmt.Errorf("addresses of %s in %s: %w", m.cfg.Guest.Tap, s.NetnsName, err)
		}
		for _, a := range addrs {
			if p, ok := prefixOf(a.IPNet); ok && p.Addr() == m.cfg.Guest.Gateway {
				st.Tap = tap.Attrs().Flags&net.FlagUp != 0
			}
		}
	}
	tapIndex := 0
	if tap != nil {
		tapIndex = tap.Attrs().Index
	}
	if st.Forwarding, err = forwards(h, fd, s, tapIndex); err != nil {
		return st, err
	}
	f, err := inside.Inspect(insideSlot(fd, s), m.cfg.Guest.insideGuest())
	if err != nil {
		return st, err
	}
	st.NAT, st.TapFilter = f.GuestNAT, f.TapFilter
	return st, nil
}

// forwards reports whether slot s forwards on its uplink and on tap (0
// when there is none), as forwardGuest left them. A slot made by a build
// that turned ip_forward on forwards on every link, these among them.
func forwards(h *netlink.Handle, fd int, s *Slot, tap int) (bool, error) {
	return onGuestLinks(h, fd, s, tap, netconf.Forwarding)
}

// onGuestLinks calls fn, over one rtnetlink connection in slot s's
// namespace fd, for the tap (index tap, skipped when 0) and the slot's
// uplink, until one fails or says false.
func onGuestLinks(h *netlink.Handle, fd int, s *Slot, tap int, fn func(c *mnl.Conn, link int32) (bool, error)) (bool, error) {
	up, err := h.LinkByName(s.InsideIf)
	if err != nil {
		return false, fmt.Errorf("find %s in %s: %w", s.InsideIf, s.NetnsName, err)
	}
	c, err := netconf.Dial(fd)
	if err != nil {
		return false, fmt.Errorf("forwarding in %s: %w", s.NetnsName, err)
	}
	defer c.Close()
	for _, link := range []int{tap, up.Attrs().Index} {
		if link == 0 {
			continue
		}
		ok, err := fn(c, int32(link))
		if err != nil {
			return false, fmt.Errorf("forwarding of link %d in %s: %w", link, s.NetnsName, err)
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

// withInside runs fn on slot s's namespace (withNetns) as package inside
// sees it.
func withInside(s *Slot, fn func(inside.Slot) error) error {
	return withNetns(s, func(fd int) error { return fn(insideSlot(fd, s)) })
}

// withNetns opens slot s's namespace, checks that it is still the one s
// was made with (a namespace made again under the name is not s's), and
// runs fn with its descriptor.
func withNetns(s *Slot, fn func(fd int) error) error {
	fd, err := netns.Open(s.NetnsPath)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if s.NetnsID != (netns.ID{}) {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("slot %d: fstat %s: %w", s.Index, s.NetnsPath, err)
		}
		if (netns.ID{Dev: uint64(st.Dev), Ino: st.Ino}) != s.NetnsID {
			return fmt.Errorf("slot %d: %s is not the namespace the slot was made with: %w", s.Index, s.NetnsPath, ErrGone)
		}
	}
	return fn(fd)
}
