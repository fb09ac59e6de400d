package slot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

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

// dumpBudget bounds the retries of a dump the kernel interrupted because
// addresses or routes changed meanwhile (another daemon making or tearing
// down slots: any change in the namespace interrupts a dump that spans
// it). An interrupted dump may miss an entry that was there all along, so
// it is never used; the tries wait 1, 2, 4 … 128 ms apart. The bound is
// time, not a number of tries: another daemon filling its pool changes
// addresses every few milliseconds for seconds on end, and a dump of a
// host with many slots takes tens of them.
const dumpBudget = 5 * time.Second

// retryDump runs dump until it is not interrupted, for budget at most
// (dumpBudget). What an interrupted try gathered, reset drops.
func retryDump(budget time.Duration, dump func() error, interrupted func(error) bool, reset func()) error {
	deadline := time.Now().Add(budget)
	for try := 0; ; try++ {
		reset()
		err := dump()
		if !interrupted(err) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("interrupted by changes on the host on every try for %s: %w", budget, err)
		}
		time.Sleep(time.Millisecond << min(try, 7))
	}
}

// ForeignUses returns the host's IPv4 addresses and routes, in every
// routing table, that overlap c.CIDR and are not c's own slots'. What is
// on a link named as c's host links (<Prefix>h<i>, any index) is its own:
// the slots a restart restores keep their addresses and routes. A default
// route (0.0.0.0/0) overlaps every CIDR and is left out: it takes nothing
// from a more specific slot route. Its cost is two dumps read in place
// (ribdump.go) and one ioctl per link that holds an address or a route in
// c.CIDR.
func (c Config) ForeignUses() ([]HostUse, error) {
	r, err := c.ReadHost()
	return r.Foreign, err
}

// HostRead is what one read of the host's IPv4 addresses and routes says
// of a slot configuration: the daemon's host check and the addresses its
// egress policies deny, from the same two dumps.
type HostRead struct {
	// Foreign is what ForeignUses returns.
	Foreign []HostUse
	// Addrs is what HostAddrs returns.
	Addrs []netip.Prefix
}

// ReadHost returns ForeignUses and HostAddrs from one address dump and
// one route dump: the daemon's start needs both, and on a host with
// 10,000 slots each address dump costs the kernel ~10 ms and, while
// other slots come and go, retries.
func (c Config) ReadHost() (HostRead, error) {
	uses, addrs, err := c.walk(c.CIDR, true)
	return HostRead{Foreign: uses, Addrs: addrs}, err
}

// HostAddrs returns the host's own IPv4 addresses, each as its /32, but
// those in c.CIDR (the slots' gateways, which the CIDR covers whole): what
// an egress policy denies by default, so that a slot cannot reach the
// host's services by another of its addresses. It is one address dump
// read in place, with no link named; ReadHost gives the same beside the
// host check.
func (c Config) HostAddrs() ([]netip.Prefix, error) {
	w := &useWalk{cfg: c, hostAddrs: true} // no range: no link is named
	if err := w.dump(unix.RTM_GETADDR, make([]byte, unix.SizeofIfAddrmsg), w.addr); err != nil {
		return nil, fmt.Errorf("slot: list host addresses: %w", err)
	}
	return w.addrs, nil
}

// usesOf returns the host's IPv4 addresses and routes that overlap cidr
// and are not on c's own host links (a default route left out).
func (c Config) usesOf(cidr netip.Prefix) ([]HostUse, error) {
	uses, _, err := c.walk(cidr, false)
	return uses, err
}

// walk reads the host's addresses and routes: the uses of cidr (usesOf),
// and with hostAddrs the host's addresses outside c.CIDR (HostAddrs).
func (c Config) walk(cidr netip.Prefix, hostAddrs bool) ([]HostUse, []netip.Prefix, error) {
	probe, err := newLinkProbe()
	if err != nil {
		return nil, nil, err
	}
	defer probe.close()
	w := &useWalk{cfg: c, cidr: cidr, hostAddrs: hostAddrs, probe: probe, names: map[uint32]linkName{}}
	if err := w.dump(unix.RTM_GETADDR, make([]byte, unix.SizeofIfAddrmsg), w.addr); err != nil {
		return nil, nil, fmt.Errorf("slot: list host addresses: %w", err)
	}
	// An rtmsg with table 0 and no RTA_TABLE asks for every table.
	if err := w.dump(unix.RTM_GETROUTE, make([]byte, unix.SizeofRtMsg), w.route); err != nil {
		return nil, nil, fmt.Errorf("slot: list host routes: %w", err)
	}
	// Addresses first, then the most specific: what names the other
	// device best.
	slices.SortStableFunc(w.uses, func(a, b HostUse) int {
		if a.Route != b.Route {
			if a.Route {
				return 1
			}
			return -1
		}
		return b.Prefix.Bits() - a.Prefix.Bits()
	})
	return w.uses, w.addrs, nil
}

// useWalk gathers the foreign uses, and the host's addresses, from the
// dumps' messages.
type useWalk struct {
	cfg       Config
	cidr      netip.Prefix // what a use overlaps
	hostAddrs bool         // gather addrs
	probe     *linkProbe
	names     map[uint32]linkName // by link index, asked once each
	uses      []HostUse
	addrs     []netip.Prefix // the host's addresses outside cfg.CIDR, each its /32
}

// linkName is a link's name and whether it is one of the configuration's
// host links.
type linkName struct {
	name string
	own  bool
}

// dump runs one dump for AF_INET into w, again while the kernel
// interrupts it: what an interrupted try added is dropped.
func (w *useWalk) dump(req uint16, hdr []byte, f func(ribMsg)) error {
	hdr[0] = unix.AF_INET
	keep, keepAddrs := len(w.uses), len(w.addrs)
	return retryDump(dumpBudget, func() error { return ribDump(req, hdr, f) },
		func(err error) bool { return errors.Is(err, errDumpInterrupted) },
		func() { w.uses, w.addrs = w.uses[:keep], w.addrs[:keepAddrs] })
}

// link names link index (0: none) and says whether it is c's own.
func (w *useWalk) link(index uint32) linkName {
	if index == 0 {
		return linkName{}
	}
	n, ok := w.names[index]
	if !ok {
		n.name = w.probe.name(int(index))
		_, n.own = w.cfg.CanonicalHostIfIndex(n.name)
		w.names[index] = n
	}
	return n
}

// addr takes an RTM_NEWADDR: ifaddrmsg {family, prefixlen, flags, scope,
// index}, then IFA_LOCAL (the address itself; IFA_ADDRESS is the peer's
// on a point-to-point link) or IFA_ADDRESS. Only an address that overlaps
// the range has its link named, by the kernel, never by the address's
// IFA_LABEL, which would spare an ioctl a link: the kernel takes any label
// a program gives (only iproute2 checks it), so a host address labelled
// like a slot would go unseen.
func (w *useWalk) addr(m ribMsg) {
	p, ok := addrOf(m)
	if !ok {
		return
	}
	if w.hostAddrs && !w.cfg.CIDR.Contains(p.Addr()) {
		w.addrs = append(w.addrs, netip.PrefixFrom(p.Addr(), 32))
	}
	if !p.Overlaps(w.cidr) {
		return
	}
	if l := w.link(binary.NativeEndian.Uint32(m.body[4:8])); !l.own {
		w.uses = append(w.uses, HostUse{Prefix: p, Dev: l.name})
	}
}

// addrOf is the address an RTM_NEWADDR of AF_INET gives, with its prefix
// length: IFA_LOCAL, or IFA_ADDRESS when there is no IFA_LOCAL.
func addrOf(m ribMsg) (netip.Prefix, bool) {
	if m.typ != unix.RTM_NEWADDR || m.body[0] != unix.AF_INET {
		return netip.Prefix{}, false
	}
	a := m.attr(unix.IFA_LOCAL)
	if a == nil {
		a = m.attr(unix.IFA_ADDRESS)
	}
	return prefix4(a, m.body[1])
}

// route takes an RTM_NEWROUTE: rtmsg {family, dst_len, src_len, tos,
// table, protocol, scope, type, flags}, then RTA_OIF, RTA_DST and
// RTA_TABLE (the table's full number; the header's is 8 bits). A route
// without RTA_OIF (multipath, blackhole) names no device.
func (w *useWalk) route(m ribMsg) {
	if m.typ != unix.RTM_NEWROUTE || m.body[0] != unix.AF_INET || m.body[1] == 0 {
		return // the default route overlaps everything and takes nothing
	}
	p, ok := prefix4(m.attr(unix.RTA_DST), m.body[1])
	if !ok || !p.Overlaps(w.cidr) {
		return
	}
	var l linkName
	if oif := m.attr(unix.RTA_OIF); len(oif) == 4 {
		if l = w.link(binary.NativeEndian.Uint32(oif)); l.own {
			return
		}
	}
	table := int(m.body[4])
	if t := m.attr(unix.RTA_TABLE); len(t) == 4 {
		table = int(binary.NativeEndian.Uint32(t))
	}
	w.uses = append(w.uses, HostUse{Route: true, Prefix: p, Dev: l.name, Table: table})
}

// prefix4 is the IPv4 address a with prefix length bits, keeping its
// host bits (10.0.0.1/24 names the address; a route's destination has
// none).
func prefix4(a []byte, bits uint8) (netip.Prefix, bool) {
	if len(a) != 4 || bits > 32 {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(netip.AddrFrom4([4]byte(a)), int(bits)), true
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
