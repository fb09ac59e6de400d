package slot

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A dual-stack slot (Config.CIDR6) has a /127 beside its /31: the host
// end's address and the inside one, each added without duplicate address
// detection (IFA_F_NODAD): the daemon owns CIDR6 and gives each address
// to one link, so DAD could find nothing, and it would keep the address
// tentative, unusable, for a second or more after the slot is made (its
// probe, sent from ::, would be dropped by the table's antispoof chain
// anyway). Neither end has a link-local address (address generation
// none, as without IPv6): neighbour discovery runs between the two
// addresses of the /127, and the table's antispoof chain, which admits
// only a source routed back through the host end, needs no exception
// for fe80::/10. docs/DESIGN.md §5 ("IPv6") says where each rule lives.

// hostEnd6 turns IPv6 on for a dual-stack slot's host end before it comes
// up, whatever the host's default (a host may have disable_ipv6 set), and
// makes it ignore router advertisements and redirects from the slot: with
// the host's IPv6 forwarding off, the kernel would take a slot's router
// advertisement on it, and a redirect changes the host's routes. Written
// in the root namespace, where every host end lives (no netlink path).
func hostEnd6(name string) error {
	for _, w := range []struct{ key, value string }{
		{"disable_ipv6", "0"}, {"accept_ra", "0"}, {"accept_redirects", "0"},
	} {
		path := "/proc/sys/net/ipv6/conf/" + name + "/" + w.key
		if err := os.WriteFile(path, []byte(w.value), 0); err != nil {
			return fmt.Errorf("IPv6 %s of %s: %w", w.key, name, err)
		}
	}
	return nil
}

// addressHostEnd gives slot s's host end (link host, still down) its
// addresses and settings: the /31's, settleHostEnd's, and for a
// dual-stack slot the /127's.
func (m *Manager) addressHostEnd(host netlink.Link, s *Slot) error {
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(s.HostAddr)}); err != nil {
		return fmt.Errorf("address %s on %s: %w", s.HostAddr, s.HostIf, err)
	}
	v6 := s.HostAddr6.IsValid()
	if err := settleHostEnd(s.HostIf, host.Attrs().Index, v6); err != nil {
		return err
	}
	if !v6 {
		return nil
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(s.HostAddr6), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("address %s on %s: %w", s.HostAddr6, s.HostIf, err)
	}
	return nil
}

// insideAddr6 gives a dual-stack slot's eth0 (in, handle h in its
// namespace) its /127 address, without DAD; nothing for a slot without.
func insideAddr6(h *netlink.Handle, in netlink.Link, s *Slot) error {
	if !s.InsideAddr6.IsValid() {
		return nil
	}
	if err := h.AddrReplace(in, &netlink.Addr{IPNet: ipNet(s.InsideAddr6), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("address %s on %s in %s: %w", s.InsideAddr6, s.InsideIf, s.NetnsName, err)
	}
	return nil
}

// insideRoute6 is the IPv6 default route of a dual-stack slot, via its
// host end's address; nothing for a slot without.
func insideRoute6(h *netlink.Handle, in netlink.Link, s *Slot) error {
	if !s.HostAddr6.IsValid() {
		return nil
	}
	def := &netlink.Route{LinkIndex: in.Attrs().Index, Gw: s.HostAddr6.Addr().AsSlice(), Family: netlink.FAMILY_V6}
	if err := h.RouteReplace(def); err != nil {
		return fmt.Errorf("IPv6 default route via %s in %s: %w", s.HostAddr6.Addr(), s.NetnsName, err)
	}
	return nil
}

// keep6 reports whether IPv6 address a on the link called link is one a
// slot has: a dual-stack slot's own on eth0, and ::1 on lo.
func keep6(s *Slot, link string, a netlink.Addr) bool {
	if !s.InsideAddr6.IsValid() {
		return false
	}
	ip, ok := netip.AddrFromSlice(a.IP)
	if !ok {
		return false
	}
	ones, _ := a.Mask.Size()
	p := netip.PrefixFrom(ip.Unmap(), ones)
	return (link == s.InsideIf && p == s.InsideAddr6) || (link == "lo" && p == loopback6Prefix)
}

// loopback6Prefix is ::1/128.
var loopback6Prefix = netip.MustParsePrefix("::1/128")

// repair6 puts back a dual-stack slot's IPv6 address on eth0 and its IPv6
// default route when a tenant took them away (its namespace's handle h),
// and names what it put back: what the workload's IPv6 needs, as
// its IPv4 address is checked on Get. Nothing for a slot without IPv6.
func repair6(h *netlink.Handle, s *Slot) ([]string, error) {
	if !s.InsideAddr6.IsValid() {
		return nil, nil
	}
	in, err := h.LinkByName(s.InsideIf)
	if err != nil {
		return nil, fmt.Errorf("find %s in %s: %w", s.InsideIf, s.NetnsName, err)
	}
	var back []string
	addrs, err := h.AddrList(in, netlink.FAMILY_V6)
	if err != nil {
		return nil, fmt.Errorf("IPv6 addresses of %s in %s: %w", s.InsideIf, s.NetnsName, err)
	}
	if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return keep6(s, s.InsideIf, a) }) {
		if err := insideAddr6(h, in, s); err != nil {
			return back, err
		}
		back = append(back, "IPv6 address "+s.InsideAddr6.String())
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{LinkIndex: in.Attrs().Index}, netlink.RT_FILTER_OIF)
	if err != nil {
		return back, fmt.Errorf("IPv6 routes of %s in %s: %w", s.InsideIf, s.NetnsName, err)
	}
	gw := s.HostAddr6.Addr()
	if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
		g, _ := netip.AddrFromSlice(r.Gw)
		return (r.Dst == nil || r.Dst.IP.IsUnspecified()) && g == gw
	}) {
		if err := insideRoute6(h, in, s); err != nil {
			return back, err
		}
		back = append(back, "IPv6 default route via "+gw.String())
	}
	return back, nil
}

// attach6 gives the container's end of a dual-stack slot's attachment
// (in, handle to in the runtime's namespace, already up) the slot's
// inside IPv6 address, without DAD, and the IPv6 default route via the
// host end: the CNI result lists both families. A namespace whose IPv6 is
// off (disable_ipv6) refuses the address, and the ADD fails saying so.
// Nothing for a slot without IPv6.
func attach6(to *netlink.Handle, in netlink.Link, s *Slot) error {
	if !s.InsideAddr6.IsValid() {
		return nil
	}
	name := in.Attrs().Name
	if err := to.AddrReplace(in, &netlink.Addr{IPNet: ipNet(s.InsideAddr6), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("address %s on %s (is IPv6 off in the namespace?): %w", s.InsideAddr6, name, err)
	}
	def := &netlink.Route{LinkIndex: in.Attrs().Index, Gw: s.HostAddr6.Addr().AsSlice(), Family: netlink.FAMILY_V6}
	if err := to.RouteReplace(def); err != nil {
		return fmt.Errorf("IPv6 default route via %s on %s: %w", s.HostAddr6.Addr(), name, err)
	}
	return nil
}

// dropHostAddr6 takes a dual-stack slot's host address off link (its
// host end, to be parked or unplugged), as the IPv4 one is: the new host
// end takes it. Already gone is not an error; nothing for a slot without.
func dropHostAddr6(link netlink.Link, s *Slot) error {
	if !s.HostAddr6.IsValid() {
		return nil
	}
	if err := netlink.AddrDel(link, &netlink.Addr{IPNet: ipNet(s.HostAddr6)}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("take %s off %s: %w", s.HostAddr6, s.HostIf, err)
	}
	return nil
}
