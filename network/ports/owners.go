package ports

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
)

// The refusals of a claim, besides ErrInvalid.
var (
	// ErrTaken is a host port another lease publishes.
	ErrTaken = errors.New("ports: host port published by another lease")
	// ErrBound is a host port a socket of the host is bound to: a DNAT
	// would take it from the host's own service.
	ErrBound = errors.New("ports: host port bound on the host")
	// ErrNotHost is a host address that is not one of the host's.
	ErrNotHost = errors.New("ports: not an address of the host")
)

// Owners is the one owner of the host ports: which lease (by its id)
// publishes which. A claim is refused when another lease holds an
// overlapping mapping (Mapping.Overlaps), or when a socket of the host is
// bound to the port, or when its host address is not the host's. It is
// memory alone: the daemon loads it from the leases' records at a start.
// An Owners is safe for concurrent use.
type Owners struct {
	netns string
	mu    sync.Mutex
	by    map[string]claim
}

// claim is an owner's mappings and the slot address they lead to.
type claim struct {
	to netip.Addr
	ms []Mapping
}

// NewOwners returns an Owners whose host is the network namespace at
// netnsPath ("" for the caller's): where it looks for bound sockets and
// the host's addresses.
func NewOwners(netnsPath string) *Owners {
	return &Owners{netns: netnsPath, by: map[string]claim{}}
}

// Claim makes ms the mappings of owner, leading to the slot address to,
// in place of those it had, or refuses them all (ErrInvalid, ErrTaken,
// ErrBound, ErrNotHost), changing nothing. The host is asked only about
// the mappings owner did not hold.
func (o *Owners) Claim(owner string, to netip.Addr, ms []Mapping) error {
	if err := ValidateList(ms); err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	had := o.by[owner].ms
	for _, m := range ms {
		for other, theirs := range o.by {
			if other == owner {
				continue
			}
			if i := slices.IndexFunc(theirs.ms, m.Overlaps); i >= 0 {
				return fmt.Errorf("%w: %s overlaps %s", ErrTaken, m, theirs.ms[i])
			}
		}
	}
	var fresh []Mapping
	for _, m := range ms {
		if !slices.Contains(had, m) {
			fresh = append(fresh, m)
		}
	}
	if err := o.hostCheck(fresh); err != nil {
		return err
	}
	o.set(owner, to, ms)
	return nil
}

// set records owner's claim, or forgets it for none.
func (o *Owners) set(owner string, to netip.Addr, ms []Mapping) {
	if len(ms) == 0 {
		delete(o.by, owner)
		return
	}
	o.by[owner] = claim{to: to, ms: slices.Clone(ms)}
}

// Load records owner's mappings as a start reads them from its record,
// without asking the host (its ports are DNAT'd already, and a socket
// bound since is the host's to lose).
func (o *Owners) Load(owner string, to netip.Addr, ms []Mapping) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.set(owner, to, ms)
}

// Drop forgets owner's mappings: its host ports are free.
func (o *Owners) Drop(owner string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.by, owner)
}

// Of returns owner's mappings.
func (o *Owners) Of(owner string) []Mapping {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.by[owner].ms)
}

// Entries are every owner's mappings with the slot address each leads
// to: what the maps must hold (Table.Sync).
func (o *Owners) Entries() []Entry {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []Entry
	for _, c := range o.by {
		for _, m := range c.ms {
			out = append(out, Entry{Mapping: m, To: c.to})
		}
	}
	return out
}

// hostCheck asks the host about ms: each host address must be the host's,
// and no socket may be bound to the port.
func (o *Owners) hostCheck(ms []Mapping) error {
	if len(ms) == 0 {
		return nil
	}
	check := func() error {
		var addrs []netlink.Addr
		if slices.ContainsFunc(ms, func(m Mapping) bool { return m.HostIP.IsValid() }) {
			var err error
			if addrs, err = hostAddrs(); err != nil {
				return err
			}
		}
		for _, m := range ms {
			if m.HostIP.IsValid() && !slices.ContainsFunc(addrs, func(a netlink.Addr) bool {
				ip, ok := netip.AddrFromSlice(a.IP)
				return ok && ip.Unmap() == m.HostIP.Unmap()
			}) {
				return fmt.Errorf("%w: %s", ErrNotHost, m)
			}
			if err := bindProbe(m); err != nil {
				return err
			}
		}
		return nil
	}
	if o.netns == "" {
		return check()
	}
	fd, err := netns.Open(o.netns)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return netns.Do(fd, check)
}

// hostAddrs lists the IPv4 addresses of the caller's namespace. A dump the
// kernel says was interrupted (a link or address changed meanwhile) is
// asked again.
func hostAddrs() ([]netlink.Addr, error) {
	var err error
	for range 5 {
		var addrs []netlink.Addr
		if addrs, err = netlink.AddrList(nil, netlink.FAMILY_V4); err == nil {
			return addrs, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return nil, fmt.Errorf("ports: list the host's addresses: %w", err)
}

// bindProbe binds a socket of m's protocol to its host address and port,
// and closes it: the kernel's own answer to whether a socket of the host
// holds the port (a listener, a bound UDP socket, an SCTP endpoint), on
// that address or on every one. A TCP probe reuses the address, so that a
// closed connection's TIME_WAIT does not count, and a listener still
// does. A kernel without SCTP has no SCTP socket bound.
func bindProbe(m Mapping) error {
	typ, proto, reuse := unix.SOCK_STREAM, 0, true
	switch m.Protocol {
	case UDP:
		typ, reuse = unix.SOCK_DGRAM, false
	case SCTP:
		proto = unix.IPPROTO_SCTP
	}
	fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		if m.Protocol == SCTP && (errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ESOCKTNOSUPPORT)) {
			return nil
		}
		return fmt.Errorf("ports: probe %s: socket: %w", m, err)
	}
	defer unix.Close(fd)
	if reuse {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return fmt.Errorf("ports: probe %s: SO_REUSEADDR: %w", m, err)
		}
	}
	sa := &unix.SockaddrInet4{Port: int(m.HostPort)}
	if m.HostIP.IsValid() {
		sa.Addr = m.HostIP.Unmap().As4()
	}
	if err := unix.Bind(fd, sa); err != nil {
		if errors.Is(err, unix.EADDRINUSE) {
			return fmt.Errorf("%w: %s", ErrBound, m)
		}
		return fmt.Errorf("ports: probe %s: bind: %w", m, err)
	}
	return nil
}
