package slot

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// HostUse is an address or a route of the host (the network namespace the
// caller runs in) that falls in a slot CIDR and is not one of the
// configuration's own slots: another daemon's slot, a host interface's
// address, a route someone added.
type HostUse struct {
	// Route is true for a route, false for an address.
	Route bool
	// Prefix is the address (with its prefix length) or the route's
	// destination.
	Prefix netip.Prefix
	// Dev names the device, "" for a route without one (blackhole,
	// unreachable, multipath).
	Dev string
	// Table is the route's table (RT_TABLE_MAIN is 254).
	Table int
}

func (u HostUse) String() string {
	dev := ""
	if u.Dev != "" {
		dev = " dev " + u.Dev
	}
	if !u.Route {
		return fmt.Sprintf("address %s%s", u.Prefix, dev)
	}
	table := ""
	if u.Table != unix.RT_TABLE_MAIN {
		table = fmt.Sprintf(" table %d", u.Table)
	}
	return fmt.Sprintf("route %s%s%s", u.Prefix, dev, table)
}

// dumpTries bounds the retries of a dump the kernel interrupted because
// addresses or routes changed meanwhile (another daemon making slots).
const dumpTries = 10

// ForeignUses returns the host's IPv4 addresses and routes, in every
// routing table, that overlap c.CIDR and are not c's own slots'. What is
// on a link named as c's host links (<Prefix>h<i>, any index) is its own:
// the slots a restart restores keep their addresses and routes. A default
// route (0.0.0.0/0) overlaps every CIDR and is left out: it takes nothing
// from a more specific slot route.
func (c Config) ForeignUses() ([]HostUse, error) { return c.usesOf(c.CIDR) }

// usesOf returns the host's IPv4 addresses and routes that overlap p and
// are not on c's own host links (a default route left out).
func (c Config) usesOf(cidr netip.Prefix) ([]HostUse, error) {
	names := map[int]string{}
	probe, err := newLinkProbe()
	if err != nil {
		return nil, err
	}
	defer probe.close()
	own := func(index int) (string, bool) {
		if index == 0 {
			return "", false
		}
		name, ok := names[index]
		if !ok {
			name = probe.name(index)
			names[index] = name
		}
		_, mine := c.CanonicalHostIfIndex(name)
		return name, mine
	}
	addrs, err := hostAddrList()
	if err != nil {
		return nil, err
	}
	var uses []HostUse
	for _, a := range addrs {
		p, ok := prefixOf(a.IPNet)
		if !ok || !p.Overlaps(cidr) {
			continue
		}
		if name, mine := own(a.LinkIndex); !mine {
			uses = append(uses, HostUse{Prefix: p, Dev: name})
		}
	}
	var routes []netlink.Route
	for range dumpTries {
		routes, err = netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("slot: list host routes: %w", err)
	}
	for _, r := range routes {
		p, ok := prefixOf(r.Dst)
		if !ok || p.Bits() == 0 || !p.Overlaps(cidr) {
			continue
		}
		if name, mine := own(r.LinkIndex); !mine {
			uses = append(uses, HostUse{Route: true, Prefix: p, Dev: name, Table: r.Table})
		}
	}
	// Addresses first, then the most specific: what names the other
	// device best.
	slices.SortStableFunc(uses, func(a, b HostUse) int {
		if a.Route != b.Route {
			if a.Route {
				return 1
			}
			return -1
		}
		return b.Prefix.Bits() - a.Prefix.Bits()
	})
	return uses, nil
}

// hostAddrList dumps the host's IPv4 addresses, again when the kernel
// interrupted the dump (addresses changed meanwhile).
func hostAddrList() ([]netlink.Addr, error) {
	var addrs []netlink.Addr
	var err error
	for range dumpTries {
		if addrs, err = netlink.AddrList(nil, netlink.FAMILY_V4); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("slot: list host addresses: %w", err)
	}
	return addrs, nil
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(n.IP.To4())
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	if bits != 32 {
		return netip.Prefix{}, false
	}
	// An address keeps its host bits (10.0.0.1/24 names the address); a
	// route's destination has none.
	return netip.PrefixFrom(ip, ones), true
}

// routedAlready returns the route the host would take to p's addresses
// when it is more specific than a default route: a slot's /31 added on
// top of it would duplicate it (two links holding one address, and traffic
// for one tenant reaching another). It asks the kernel for the matching
// FIB entry (RTM_F_FIB_MATCH), one lookup per address, without a dump.
func routedAlready(p netip.Prefix) (*HostUse, error) {
	for _, a := range []netip.Addr{p.Masked().Addr(), p.Masked().Addr().Next()} {
		rs, err := netlink.RouteGetWithOptions(a.AsSlice(), &netlink.RouteGetOptions{FIBMatch: true})
		if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) {
			continue // no route at all: nothing to duplicate
		}
		if err != nil {
			return nil, fmt.Errorf("route get %s: %w", a, err)
		}
		for _, r := range rs {
			dst, ok := prefixOf(r.Dst)
			if !ok || dst.Bits() == 0 {
				continue
			}
			name := ""
			if r.LinkIndex != 0 {
				l, err := netlink.LinkByIndex(r.LinkIndex)
				if err != nil {
					// A device already unlisted whose routes the kernel
					// has not flushed yet: a link being destroyed, such
					// as this index's leftover, whose routes go with it.
					continue
				}
				name = l.Attrs().Name
			}
			return &HostUse{Route: true, Prefix: dst, Dev: name, Table: r.Table}, nil
		}
	}
	return nil, nil
}
