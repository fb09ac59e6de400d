package slot

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ForeignUses6 is ForeignUses of CIDR6: the host's IPv6 addresses and
// routes, in every table, that overlap c.CIDR6 and are not on a link
// named as c's host links (<Prefix>h<i>); none when c has no CIDR6. A
// default route (::/0) is left out, as IPv4's. Unlike ForeignUses it reads
// through the netlink library (a struct per entry): it runs only for a
// configuration with an IPv6 slot range (Config.CIDR6), once at its start.
func (c Config) ForeignUses6() ([]HostUse, error) {
	if !c.IPv6() {
		return nil, nil
	}
	var addrs []netlink.Addr
	var routes []netlink.Route
	interrupted := func(err error) bool { return errors.Is(err, netlink.ErrDumpInterrupted) }
	if err := retryDump(dumpBudget, func() (err error) { addrs, err = netlink.AddrList(nil, netlink.FAMILY_V6); return err }, interrupted, func() {}); err != nil {
		return nil, fmt.Errorf("slot: list the host's IPv6 addresses: %w", err)
	}
	all := &netlink.Route{Table: unix.RT_TABLE_UNSPEC}
	if err := retryDump(dumpBudget, func() (err error) {
		routes, err = netlink.RouteListFiltered(netlink.FAMILY_V6, all, netlink.RT_FILTER_TABLE)
		return err
	}, interrupted, func() {}); err != nil {
		return nil, fmt.Errorf("slot: list the host's IPv6 routes: %w", err)
	}
	var uses []HostUse
	for _, a := range addrs {
		if p, ok := prefix6Of(a.IPNet); ok && c.CIDR6.Overlaps(p) {
			uses = c.use6(uses, HostUse{Prefix: p}, a.LinkIndex)
		}
	}
	for _, r := range routes {
		p, ok := prefix6Of(r.Dst)
		if ok && p.Bits() > 0 && c.CIDR6.Overlaps(p) && r.Type != unix.RTN_LOCAL {
			uses = c.use6(uses, HostUse{Route: true, Prefix: p, Table: r.Table}, r.LinkIndex)
		}
	}
	return uses, nil
}

// use6 appends u, on the link of index link, to uses unless the link is
// one of c's host links.
func (c Config) use6(uses []HostUse, u HostUse, link int) []HostUse {
	if link != 0 {
		if l, err := netlink.LinkByIndex(link); err == nil {
			u.Dev = l.Attrs().Name
		}
	}
	if _, ours := c.CanonicalHostIfIndex(u.Dev); ours {
		return uses
	}
	return append(uses, u)
}

// prefix6Of is prefixOf of IPv6: an address with its prefix length, or a
// route's destination; ok false for anything else.
func prefix6Of(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil || n.IP.To4() != nil {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(n.IP)
	ones, bits := n.Mask.Size()
	if !ok || bits != 128 {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(ip, ones), true
}
