package slot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/nft"
)

// DefaultHostGoneTimeout is how long Destroy waits for the kernel to remove a
// slot's host link after its namespace file is gone before deleting the link
// itself.
const DefaultHostGoneTimeout = 2 * time.Second

// ErrIndex is wrapped by errors about an index outside [1, Config.Slots].
var ErrIndex = errors.New("slot index out of range")

// Options tune a Manager. The zero value is the default.
type Options struct {
	// HostGoneTimeout bounds Destroy's wait for the host link to vanish
	// (default DefaultHostGoneTimeout). A link still there afterwards
	// belongs to a namespace something keeps alive, and is deleted.
	HostGoneTimeout time.Duration
}

// Manager does the kernel work for the slots of one Config. It holds no
// file descriptors between calls and is safe for concurrent use, as long as
// no two calls work on the same index at once (the allocator guarantees that).
type Manager struct {
	cfg      Config
	fw       *nft.Table
	hostGone time.Duration
}

// NewManager validates cfg, prepares the netns directory and makes sure the
// nftables table exists.
func NewManager(ctx context.Context, cfg Config, opts Options) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	fw, err := nft.New(cfg.TableName())
	if err != nil {
		return nil, err
	}
	if err := netns.PrepareDir(cfg.NetnsDir); err != nil {
		return nil, err
	}
	if err := fw.Ensure(ctx); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, fw: fw, hostGone: opts.HostGoneTimeout}
	if m.hostGone <= 0 {
		m.hostGone = DefaultHostGoneTimeout
	}
	return m, nil
}

// Config returns the manager's configuration.
func (m *Manager) Config() Config { return m.cfg }

// Firewall returns the manager's nftables table.
func (m *Manager) Firewall() *nft.Table { return m.fw }

func (m *Manager) checkIndex(i int) error {
	if i < 1 || i > m.cfg.Slots {
		return fmt.Errorf("%w: %d not in [1, %d]", ErrIndex, i, m.cfg.Slots)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Create makes slot i: netns, veth pair, addresses, links up, default route
// inside and the set element. A leftover with the same index (netns file or
// host link) is destroyed first. On failure everything made is removed and
// the error says which step failed.
func (m *Manager) Create(ctx context.Context, i int) (*Slot, error) {
	if err := m.checkIndex(i); err != nil {
		return nil, err
	}
	s := m.cfg.Slot(i)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("slot: create %d: %w", i, err)
	}
	var st unix.Stat_t
	fileErr := unix.Lstat(s.NetnsPath, &st)
	hostIdx, err := linkIndex(s.HostIf)
	if err != nil {
		return nil, err
	}
	if fileErr == nil || hostIdx != 0 {
		if err := m.Destroy(ctx, i); err != nil {
			return nil, fmt.Errorf("slot: create %d: clean leftover: %w", i, err)
		}
	}
	if err := m.create(ctx, &s); err != nil {
		err = fmt.Errorf("slot: create %d: %w", i, err)
		if derr := m.Destroy(context.WithoutCancel(ctx), i); derr != nil {
			return nil, errors.Join(err, fmt.Errorf("slot: clean after failed create: %w", derr))
		}
		return nil, err
	}
	return &s, nil
}

func (m *Manager) create(ctx context.Context, s *Slot) error {
	path, err := netns.Create(ctx, m.cfg.NetnsDir, s.NetnsName)
	if err != nil {
		return err
	}
	fd, err := netns.Open(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)

	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: s.HostIf},
		PeerName:      s.InsideIf,
		PeerNamespace: netlink.NsFd(fd),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s<->%s: %w", s.HostIf, s.InsideIf, err)
	}
	host, err := netlink.LinkByName(s.HostIf)
	if err != nil {
		return fmt.Errorf("find %s: %w", s.HostIf, err)
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(s.HostAddr)}); err != nil {
		return fmt.Errorf("address %s on %s: %w", s.HostAddr, s.HostIf, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("set %s up: %w", s.HostIf, err)
	}
	if err := m.configureInside(fd, s); err != nil {
		return err
	}
	return m.fw.Add(ctx, s.HostIf)
}

// configureInside sets lo and eth0 up, eth0's address and the default route,
// through a netlink handle opened on the namespace.
func (m *Manager) configureInside(fd int, s *Slot) error {
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", s.NetnsName, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in %s: %w", s.NetnsName, err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up in %s: %w", s.NetnsName, err)
	}
	in, err := h.LinkByName(s.InsideIf)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", s.InsideIf, s.NetnsName, err)
	}
	if err := h.AddrReplace(in, &netlink.Addr{IPNet: ipNet(s.InsideAddr)}); err != nil {
		return fmt.Errorf("address %s on %s in %s: %w", s.InsideAddr, s.InsideIf, s.NetnsName, err)
	}
	if err := h.LinkSetUp(in); err != nil {
		return fmt.Errorf("set %s up in %s: %w", s.InsideIf, s.NetnsName, err)
	}
	def := &netlink.Route{LinkIndex: in.Attrs().Index, Gw: s.HostAddr.Addr().AsSlice()}
	if err := h.RouteReplace(def); err != nil {
		return fmt.Errorf("default route via %s in %s: %w", s.HostAddr.Addr(), s.NetnsName, err)
	}
	return nil
}

// Destroy removes slot i: its set element, its netns file (detach + unlink,
// EBUSY-safe), and then waits up to Options.HostGoneTimeout for the kernel to
// remove the veth pair with the namespace. If the host link is still there
// (a process or descriptor keeps the namespace alive) it is deleted, which
// cuts whatever lives in the namespace off. Destroy is idempotent; a netns
// file that stays stuck is reported as a *netns.BusyError.
func (m *Manager) Destroy(ctx context.Context, i int) error {
	if err := m.checkIndex(i); err != nil {
		return err
	}
	s := m.cfg.Slot(i)
	var errs []error
	hostIdx, err := linkIndex(s.HostIf)
	if err != nil {
		errs = append(errs, err)
	}
	if err := m.fw.Remove(ctx, s.HostIf); err != nil {
		errs = append(errs, err)
	}
	if err := netns.Delete(ctx, m.cfg.NetnsDir, s.NetnsName); err != nil {
		errs = append(errs, err)
	}
	if hostIdx != 0 {
		p, err := newLinkProbe()
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		defer p.close()
		link := hostLink{index: hostIdx, name: s.HostIf}
		stuck, err := waitLinksGone(ctx, p, []hostLink{link}, time.Now().Add(m.hostGone))
		if err != nil {
			errs = append(errs, err)
		}
		if len(stuck) > 0 {
			if err := deleteLink(p, hostIdx, s.HostIf); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("slot: destroy %d: %w", i, errors.Join(errs...))
	}
	return nil
}

// waitLinksGone polls until every link is gone, the deadline passes or ctx
// ends, and returns the links still there.
func waitLinksGone(ctx context.Context, p *linkProbe, links []hostLink, deadline time.Time) ([]hostLink, error) {
	left := append([]hostLink(nil), links...)
	delay := time.Millisecond
	for {
		keep := left[:0]
		for _, l := range left {
			ok, err := p.exists(l.index, l.name)
			if err != nil {
				return left, err
			}
			if ok {
				keep = append(keep, l)
			}
		}
		left = keep
		if len(left) == 0 {
			return nil, nil
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return left, nil
		}
		t := time.NewTimer(min(delay, wait))
		select {
		case <-ctx.Done():
			t.Stop()
			return left, nil
		case <-t.C:
		}
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// Reset undoes what a user of slot s could have changed inside its
// namespace: links other than lo and eth0 are deleted, eth0 keeps only the
// slot's IPv4 address, the main routing table keeps only the connected /31
// and the default route, lo and eth0 are up, and the conntrack entries of the
// slot (inside, and for its address on the host) are flushed.
func (m *Manager) Reset(ctx context.Context, s *Slot) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("slot: reset %d: %w", s.Index, err)
	}
	fd, err := netns.Open(s.NetnsPath)
	if err != nil {
		return fmt.Errorf("slot: reset %d: %w", s.Index, err)
	}
	defer unix.Close(fd)
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		return fmt.Errorf("slot: reset %d: netlink handle: %w", s.Index, err)
	}
	defer h.Close()
	wrap := func(step string, err error) error {
		return fmt.Errorf("slot: reset %d: %s: %w", s.Index, step, err)
	}
	links, err := h.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return wrap("list links", err)
	}
	var in netlink.Link
	for _, l := range links {
		switch l.Attrs().Name {
		case "lo":
		case s.InsideIf:
			in = l
		default:
			if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				return wrap("delete link "+l.Attrs().Name, err)
			}
		}
	}
	if in == nil {
		return wrap("find "+s.InsideIf, unix.ENODEV)
	}
	addrs, err := h.AddrList(in, netlink.FAMILY_V4)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return wrap("list addresses", err)
	}
	want := ipNet(s.InsideAddr)
	for _, a := range addrs {
		if a.IPNet.String() == want.String() {
			continue
		}
		if err := h.AddrDel(in, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return wrap("delete address "+a.IPNet.String(), err)
		}
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return wrap("list routes", err)
	}
	conn := s.InsideAddr.Masked().String()
	for _, r := range routes {
		isDefault := r.Dst == nil || r.Dst.String() == "0.0.0.0/0"
		if isDefault && r.LinkIndex == in.Attrs().Index && r.Gw.Equal(s.HostAddr.Addr().AsSlice()) {
			continue
		}
		if !isDefault && r.Dst.String() == conn && r.LinkIndex == in.Attrs().Index {
			continue
		}
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			return wrap("delete route "+r.String(), err)
		}
	}
	if err := m.configureInside(fd, s); err != nil {
		return wrap("configure", err)
	}
	// Conntrack inside the namespace: everything; on the host: the slot's flows.
	if err := h.ConntrackTableFlush(netlink.ConntrackTable); err != nil && !ignorableConntrack(err) {
		return wrap("flush conntrack inside", err)
	}
	if err := flushHostConntrack(s.InsideAddr.Addr()); err != nil && !ignorableConntrack(err) {
		return wrap("flush host conntrack", err)
	}
	return nil
}

// ignorableConntrack: no conntrack in this namespace (module not loaded).
func ignorableConntrack(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPROTONOSUPPORT)
}
