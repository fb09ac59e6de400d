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

	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/internal/netconf"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/ports"
)

// DefaultHostGoneTimeout is the recommended Options.HostGoneTimeout: how long
// Destroy waits for the kernel to remove a slot's host link after its
// namespace file is gone before deleting the link itself.
const DefaultHostGoneTimeout = 2 * time.Second

// ErrIndex is wrapped by errors about an index outside [1, Config.Slots].
var ErrIndex = errors.New("slot index out of range")

// Options tune a Manager. Every zero value means zero; DefaultOptions
// returns the recommended values.
type Options struct {
	// HostGoneTimeout bounds Destroy's wait for the host link to vanish
	// with its namespace. A link still there afterwards belongs to a
	// namespace something keeps alive, and is deleted. Zero means no wait:
	// Destroy deletes a host link it finds itself, which is correct but
	// costs an RCU grace period under the networking lock per link instead
	// of letting the kernel batch it. Negative is invalid.
	HostGoneTimeout time.Duration
	// Firewall is what the slot table's rules let slots reach (see package
	// nft). The zero value isolates slots from one another and from the
	// host's services.
	Firewall nft.Isolation
	// Egress is the daemon's part of every lease's egress policy (the
	// always-allowed and always-denied sets, the egress proxy's port),
	// written into the slot table and read by ApplyEgress.
	Egress egress.Defaults
	// Stamp names the records the manager's slots are made under (the
	// lease store's generation): every slot it makes, or whose firewall
	// element it puts back, is named in the firewall table's set of that
	// stamp (nft.WithStamp), which Stamps reads back, so that a slot made
	// under records that are gone is told from one made by something that
	// kept none (DESIGN.md section 6). Empty stamps nothing; else 1 to 64
	// letters, digits and underscores.
	Stamp string
}

// DefaultOptions returns the recommended options.
func DefaultOptions() Options {
	return Options{HostGoneTimeout: DefaultHostGoneTimeout}
}

// Manager does the kernel work for the slots of one Config. It holds no
// file descriptors between calls and is safe for concurrent use, as long as
// no two calls work on the same index at once (the allocator guarantees that).
type Manager struct {
	cfg      Config
	fw       *nft.Table
	ports    *ports.Table // the leases' published ports, in fw
	hostGone time.Duration
	ct       *ctCleaner
	stamp    string // Options.Stamp
	// allWrites is the namespace-wide values each new slot writes
	// (settings.go), read from the host once.
	allWrites []sysctlWrite
}

// NewManager validates cfg and opts, prepares the netns directory and writes
// the nftables table's rules for opts.Firewall (keeping the elements of a
// table an earlier run made).
func NewManager(ctx context.Context, cfg Config, opts Options) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.HostGoneTimeout < 0 {
		return nil, fmt.Errorf("slot: negative HostGoneTimeout %v", opts.HostGoneTimeout)
	}
	if err := opts.Egress.Validate(); err != nil {
		return nil, err
	}
	nopts := []nft.Option{nft.WithIsolation(opts.Firewall), nft.WithEgress(opts.Egress), nft.WithSlotNetwork(cfg.CIDR), nft.WithSlotNetwork6(cfg.CIDR6)}
	if opts.Stamp != "" {
		nopts = append(nopts, nft.WithStamp(opts.Stamp))
	}
	fw, err := nft.New(cfg.TableName(), nopts...)
	if err != nil {
		return nil, err
	}
	if err := netns.PrepareDir(cfg.NetnsDir); err != nil {
		return nil, err
	}
	if err := fw.Ensure(ctx); err != nil {
		return nil, err
	}
	pt := ports.New(fw)
	if err := pt.Ensure(ctx); err != nil {
		return nil, err
	}
	ct := newCTCleaner(func(i int) netip.Addr { _, in := cfg.Addrs(i); return in.Addr() })
	return &Manager{cfg: cfg, fw: fw, ports: pt, hostGone: opts.HostGoneTimeout, ct: ct, stamp: opts.Stamp, allWrites: allWrites("/proc/sys")}, nil
}

// Stamp returns the manager's stamp (Options.Stamp).
func (m *Manager) Stamp() string { return m.stamp }

// Stamps returns the stamp each slot was made under, by index, for the
// slots a manager with another stamp than this one's made (a name made
// again under this stamp may still be there): a dump of the table's set
// names, and of each other stamp's set, made only when asked. A slot not
// in it was made under this stamp, by a build that stamped nothing, or
// by something else than a manager.
func (m *Manager) Stamps(ctx context.Context) (map[int]string, error) {
	byName, err := m.fw.Stamps(ctx)
	if err != nil {
		return nil, fmt.Errorf("slot: %w", err)
	}
	out := make(map[int]string, len(byName))
	for name, st := range byName {
		if i, ok := m.cfg.CanonicalHostIfIndex(name); ok {
			out[i] = st
		}
	}
	return out, nil
}

// DropOtherStamps forgets the stamps of other records than the manager's
// (nft.Table.DropStamps), once the slots they name are held, recorded,
// or reclaimed.
func (m *Manager) DropOtherStamps(ctx context.Context) error {
	if err := m.fw.DropStamps(ctx); err != nil {
		return fmt.Errorf("slot: %w", err)
	}
	return nil
}

// Config returns the manager's configuration.
func (m *Manager) Config() Config { return m.cfg }

// Firewall returns the manager's nftables table.
func (m *Manager) Firewall() *nft.Table { return m.fw }

// Ports returns the published ports of the manager's table (package
// ports), whose chains NewManager wrote.
func (m *Manager) Ports() *ports.Table { return m.ports }

func (m *Manager) checkIndex(i int) error {
	if i < 1 || i > m.cfg.Slots {
		return fmt.Errorf("%w: %d not in [1, %d]", ErrIndex, i, m.cfg.Slots)
	}
	return nil
}

// inRange returns the indices in [1, Config.Slots] of indices.
func (m *Manager) inRange(indices []int) []int {
	out := make([]int, 0, len(indices))
	for _, i := range indices {
		if i >= 1 && i <= m.cfg.Slots {
			out = append(out, i)
		}
	}
	return out
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Create makes slot i: netns, veth pair, addresses, links up, default route
// inside and the set element, and fills the slot's kernel identity (NetnsID,
// HostIfIndex). A leftover with the same index (netns file or host link) is
// destroyed first, and the host's conntrack entries for the slot's inside
// address are cleared before the slot is reachable, so a slot never inherits
// flows of an earlier slot at its index (a reply to the earlier tenant's
// connection would otherwise be translated and delivered to the new one):
// by a pass over the host's table that started after the index's last slot
// was gone, one pass shared by every index that needs it (conntrack.go).
// On failure everything made is removed and the error says which step
// failed.
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
	m.ct.seenGone(i)
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
	// The leftover of this index is gone: a route that still reaches the
	// slot's addresses is somebody else's, and the slot's own would
	// duplicate it.
	if r, err := routedAlready(s.HostAddr); err != nil {
		return err
	} else if r != nil {
		return fmt.Errorf("%s is already routed by the host (%s): a slot there would duplicate it", s.HostAddr.Masked(), r)
	}
	// Before the veth exists nothing can refresh an entry for the address.
	if err := m.ct.await(ctx, s.Index); err != nil {
		return fmt.Errorf("flush host conntrack for %s: %w", s.InsideAddr.Addr(), err)
	}
	m.ct.busy(s.Index)
	path, err := netns.Create(ctx, m.cfg.NetnsDir, s.NetnsName)
	if err != nil {
		return err
	}
	if s.NetnsID, err = netns.Stat(path); err != nil {
		return err
	}
	fd, err := netns.Open(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)

	// One queue each way on both ends, said explicitly: the kernel then
	// has none to take away after it registered the pair, which it does
	// otherwise (a veth gets a queue per CPU, one in use) by waiting out an
	// RCU grace period while it holds the networking lock, so every other
	// slot creation waited on it (figures: docs/BENCHMARKS.md).
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: s.HostIf, NumTxQueues: 1, NumRxQueues: 1},
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
	s.HostIfIndex = host.Attrs().Index
	if err := m.addressHostEnd(host, s); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("set %s up: %w", s.HostIf, err)
	}
	if err := m.configureInside(fd, s); err != nil {
		return err
	}
	if m.cfg.Guest.Enabled() {
		if err := m.makeGuest(fd, s); err != nil {
			return err
		}
	}
	return m.fw.AddNew(ctx, s.HostIf)
}

// quietIPv6 turns IPv6 off on the host end of a slot before it comes up:
// no link-local address, no duplicate address detection, no MLD, no
// per-device multicast route, and IPv6 arriving from inside dropped at the
// door. The slots are IPv4 /31s; an IPv6 host end only costs, and it costs
// per slot on the whole host: every host end's routes (fe80::/64, ff00::/8)
// sit in the same nodes of the host's tables, and every neighbour
// solicitation or MLD report sent or received on any host end picks its
// route from those nodes by a linear walk (__find_rr_leaf). With many slots
// the kernel's IPv6 workers then hold the CPUs and the RTNL lock that every
// slot operation needs, and a restart's restore of the leases slows down
// with them (figures: docs/BENCHMARKS.md). Address generation off alone
// was not enough: the multicast route stays and the insides' own DAD and
// MLD packets still arrive. The inside end keeps IPv6 (its own namespace,
// its own tables). It is written in this thread's namespace, the root (no
// goroutine changes namespace).
func quietIPv6(name string) error { return netconf.QuietIPv6(name) }

// ipv6Enabled reports whether the kernel has IPv6 at all.
func ipv6Enabled() bool { return netconf.IPv6Enabled() }

// configureInside gives lo and eth0 their settings (settleInside), sets
// them up, takes ::1 off lo, and sets eth0's address and the default
// route, through a netlink handle opened on the namespace.
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
	in, err := h.LinkByName(s.InsideIf)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", s.InsideIf, s.NetnsName, err)
	}
	// Before the links come up: eth0 makes no IPv6 address then.
	if err := m.settleInside(fd, s, lo.Attrs().Index, in.Attrs().Index); err != nil {
		return err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up in %s: %w", s.NetnsName, err)
	}
	if !s.InsideAddr6.IsValid() {
		if err := dropLoopback6(h, lo); err != nil {
			return fmt.Errorf("%w in %s", err, s.NetnsName)
		}
	}
	if err := h.AddrReplace(in, &netlink.Addr{IPNet: ipNet(s.InsideAddr)}); err != nil {
		return fmt.Errorf("address %s on %s in %s: %w", s.InsideAddr, s.InsideIf, s.NetnsName, err)
	}
	if err := insideAddr6(h, in, s); err != nil {
		return err
	}
	if err := h.LinkSetUp(in); err != nil {
		return fmt.Errorf("set %s up in %s: %w", s.InsideIf, s.NetnsName, err)
	}
	def := &netlink.Route{LinkIndex: in.Attrs().Index, Gw: s.HostAddr.Addr().AsSlice()}
	if err := h.RouteReplace(def); err != nil {
		return fmt.Errorf("default route via %s in %s: %w", s.HostAddr.Addr(), s.NetnsName, err)
	}
	return insideRoute6(h, in, s)
}

// Destroy removes slot i: its set element, its netns file (detach + unlink,
// EBUSY-safe), and then waits up to Options.HostGoneTimeout for the kernel to
// remove the veth pair with the namespace. If the host link is still there
// (a process or descriptor keeps the namespace alive) it is deleted, which
// cuts whatever lives in the namespace off; an attached slot's (known by
// its parked end) is deleted without the wait. Destroy is idempotent; a netns
// file that stays stuck is reported as a *netns.BusyError.
func (m *Manager) Destroy(ctx context.Context, i int) error {
	if err := m.checkIndex(i); err != nil {
		return err
	}
	s := m.cfg.Slot(i)
	m.ct.busy(i)
	var errs []error
	hostIdx, err := linkIndex(s.HostIf)
	if err != nil {
		errs = append(errs, err)
	}
	// A parked end: the host link pairs with an attachment's end, which
	// the namespace's end does not take (see Manager.Unplug).
	parkedIdx, err := linkIndex(m.cfg.ParkedIfName(i))
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
		stuck := []hostLink{link}
		if parkedIdx == 0 {
			stuck, err = awaitLinksGone(ctx, p, stuck, time.Now().Add(m.hostGone))
			if err != nil {
				errs = append(errs, err)
			}
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
	m.ct.gone(i)
	return nil
}
