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
	w, err := c.walk(false, c.CIDR)
	if err != nil {
		return nil, err
	}
	return w.uses[0], nil
}

// HostRead is what one read of the host's IPv4 addresses and routes says
// of a slot configuration: the daemon's host check, for the slot CIDR and
// the guest network, and the addresses its egress policies deny.
type HostRead struct {
	// Foreign is what ForeignUses returns.
	Foreign []HostUse
	// Guest is the host's addresses and routes that overlap the guest
	// network (none without a guest device): the daemon refuses to start
	// on them, as the same addresses would then mean the host's network
	// and every slot's guest.
	Guest []HostUse
	// Addrs is what HostAddrs returns.
	Addrs []netip.Prefix
}

// ReadHost returns Foreign, Guest and Addrs from one address dump and one
// route dump: the daemon's start needs all three, and on a host with
// thousands of other slots each dump is thousands of entries, interrupted
// (and read again) by every change another daemon makes meanwhile.
func (c Config) ReadHost() (HostRead, error) {
	cidrs := []netip.Prefix{c.CIDR}
	if c.Guest.Enabled() {
		cidrs = append(cidrs, c.Guest.Range())
	}
	w, err := c.walk(true, cidrs...)
	if err != nil {
		return HostRead{}, err
	}
	r := HostRead{Foreign: w.uses[0], Addrs: w.addrs}
	if len(cidrs) > 1 {
		r.Guest = w.uses[1]
	}
	return r, nil
}

// HostAddrs returns the host's own IPv4 addresses, each as its /32, but
// those in c.CIDR (the slots' gateways, which the always-denied set holds
// whole): what an egress policy denies by default, so that a slot cannot
// reach the host's services by another of its addresses. It is one address
// dump read in place with no link named (on a host with thousands of
// other daemons' slots that would be an ioctl each); ReadHost gives the
// same beside the host check.
func (c Config) HostAddrs() ([]netip.Prefix, error) {
	w := &useWalk{cfg: c, hostAddrs: true} // no range: no link is named
	if err := w.dump(unix.RTM_GETADDR, make([]byte, unix.SizeofIfAddrmsg), w.addr); err != nil {
		return nil, fmt.Errorf("slot: list host addresses: %w", err)
	}
	return w.addrs, nil
}

// walk reads the host's addresses and routes: for each of cidrs, those
// that overlap it and are not on c's own host links (a default route left
// out); with hostAddrs, also the host's addresses outside c.CIDR.
func (c Config) walk(hostAddrs bool, cidrs ...netip.Prefix) (*useWalk, error) {
	probe, err := newLinkProbe()
	if err != nil {
		return nil, err
	}
	defer probe.close()
	w := &useWalk{cfg: c, cidrs: cidrs, hostAddrs: hostAddrs, uses: make([][]HostUse, len(cidrs)), probe: probe, names: map[uint32]linkName{}}
	if err := w.dump(unix.RTM_GETADDR, make([]byte, unix.SizeofIfAddrmsg), w.addr); err != nil {
		return nil, fmt.Errorf("slot: list host addresses: %w", err)
	}
	// An rtmsg with table 0 and no RTA_TABLE asks for every table.
	if err := w.dump(unix.RTM_GETROUTE, make([]byte, unix.SizeofRtMsg), w.route); err != nil {
		return nil, fmt.Errorf("slot: list host routes: %w", err)
	}
	// Addresses first, then the most specific: what names the other
	// device best.
	for _, uses := range w.uses {
		slices.SortStableFunc(uses, func(a, b HostUse) int {
			if a.Route != b.Route {
				if a.Route {
					return 1
				}
				return -1
			}
			return b.Prefix.Bits() - a.Prefix.Bits()
		})
	}
	return w, nil
}

// useWalk gathers the foreign uses, and the host's addresses, from the
// dumps' messages.
type useWalk struct {
	cfg       Config
	cidrs     []netip.Prefix // what a use overlaps
	hostAddrs bool           // gather addrs
	probe     *linkProbe
	names     map[uint32]linkName // by link index, asked once each
	uses      [][]HostUse         // by cidr
	addrs     []netip.Prefix      // the host's addresses outside cfg.CIDR, each its /32
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
	keep := make([]int, len(w.uses))
	for i, u := range w.uses {
		keep[i] = len(u)
	}
	keepAddrs := len(w.addrs)
	return retryDump(dumpBudget, func() error { return ribDump(req, hdr, f) },
		func(err error) bool { return errors.Is(err, errDumpInterrupted) },
		func() {
			for i := range w.uses {
				w.uses[i] = w.uses[i][:keep[i]]
			}
			w.addrs = w.addrs[:keepAddrs]
		})
}

// add records use u, on the link with index link (0: none), under every
// cidr it overlaps, unless the link is one of c's own. The link is named
// only for a use that overlaps one: one ioctl per such link.
func (w *useWalk) add(u HostUse, link uint32) {
	var in []int
	for i, c := range w.cidrs {
		if u.Prefix.Overlaps(c) {
			in = append(in, i)
		}
	}
	if len(in) == 0 {
		return
	}
	l := w.link(link)
	if l.own {
		return
	}
	u.Dev = l.name
	for _, i := range in {
		w.uses[i] = append(w.uses[i], u)
	}
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
// a range has its link named, by the kernel, never by the address's
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
	w.add(HostUse{Prefix: p}, binary.NativeEndian.Uint32(m.body[4:8]))
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
	var link uint32
	if oif := m.attr(unix.RTA_OIF); len(oif) == 4 {
		link = binary.NativeEndian.Uint32(oif)
	}
	p, ok := prefix4(m.attr(unix.RTA_DST), m.body[1])
	if !ok {
		return
	}
	table := int(m.body[4])
	if t := m.attr(unix.RTA_TABLE); len(t) == 4 {
		table = int(binary.NativeEndian.Uint32(t))
	}
	w.add(HostUse{Route: true, Prefix: p, Table: table}, link)
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
