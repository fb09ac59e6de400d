package nft

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/egress"
)

// SetName is the name of the interface-name set in every table.
const SetName = "slots"

// ifNameSize is IFNAMSIZ: set keys are interface names padded to 16 bytes.
const ifNameSize = 16

// elemsPerMessage bounds the elements in one netlink message: the element
// list is one attribute and attributes are limited to 64 KiB.
const elemsPerMessage = 1024

// sockBuf is the netlink socket buffer asked for, so that one batch with
// thousands of elements goes in one write.
const sockBuf = 8 << 20

// TableName derives the table name from a slot prefix: "phasegate_" and the
// prefix with every byte outside [A-Za-z0-9_] replaced by '_'.
func TableName(prefix string) string {
	var b strings.Builder
	b.WriteString("phasegate_")
	for i := 0; i < len(prefix); i++ {
		c := prefix[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_':
			b.WriteByte(c)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Chain names of every table.
const (
	ChainForward     = "forward"
	ChainInput       = "input"
	ChainPostrouting = "postrouting"
	// ChainSpoof (prerouting, before conntrack) drops what a slot sends
	// from an address that is not its own.
	ChainSpoof = "antispoof"
	// ChainEgress (prerouting, after conntrack) applies the leases' egress
	// policies and drops what no slot may reach (LinkLocal).
	ChainEgress = "egress"
)

// Names of the port sets, the egress defaults' sets and the map from a
// slot's host interface to its egress chain.
const (
	SetHostTCP     = "host_tcp"
	SetHostUDP     = "host_udp"
	SetAlwaysAllow = "egress_always_allow"
	SetAlwaysDeny  = "egress_always_deny"
	SetAlwaysDeny6 = "egress_always_deny6"
	MapEgress      = "egress_policy"
)

// Comments of the rules whose counters Drops reads.
const (
	commentSlotToSlot = "slot-to-slot"
	commentInbound    = "inbound"
	commentToHost     = "to-host"
	commentSpoofed    = "spoofed"
	commentLinkLocal  = "link-local"
	commentLoopback   = "to-loopback"
	commentRouter6    = "ra-redirect"
)

// LinkLocal is dropped from every slot unless the daemon always allows it
// or the lease's egress policy does: the cloud metadata service
// (169.254.169.254) lives there, and a router must not forward link-local
// addresses anyway (RFC 3927).
var LinkLocal = netip.MustParsePrefix("169.254.0.0/16")

// Loopback is dropped from every slot before conntrack: a slot's host end
// with a published port routes 127/8 (route_localnet, which the host's own
// connections to 127.0.0.1:<host port> need), and no slot may reach the
// host's loopback services through it.
var Loopback = netip.MustParsePrefix("127.0.0.0/8")

// ctStatusDNAT is IPS_DST_NAT: the connection's destination was rewritten.
const ctStatusDNAT = 1 << 5

// Isolation says what the table's rules let slots reach besides the
// outside: one another and ports of the host. The zero value is the
// default for a multi-tenant host: slots are isolated from one another and
// reach no port of the host (see the package doc). A lease's egress
// policy, what a slot may send out, is package egress's.
type Isolation struct {
	// AllowSlotToSlot accepts traffic between slots instead of dropping it.
	AllowSlotToSlot bool
	// HostTCPPorts and HostUDPPorts are ports of services on the host that
	// slots may reach at their gateway address (the host end of their
	// veth). Ports must be in [1, 65535].
	HostTCPPorts, HostUDPPorts []uint16
}

// Validate reports a port outside [1, 65535].
func (p Isolation) Validate() error {
	for _, l := range [][]uint16{p.HostTCPPorts, p.HostUDPPorts} {
		if slices.Contains(l, 0) {
			return errors.New("nft: host port 0 is not a port")
		}
	}
	return nil
}

// Option configures a Table.
type Option func(*Table)

// WithIsolation sets the isolation Ensure writes (default: the zero
// Isolation).
func WithIsolation(p Isolation) Option {
	return func(t *Table) {
		t.isolation = Isolation{
			AllowSlotToSlot: p.AllowSlotToSlot,
			HostTCPPorts:    slices.Clone(p.HostTCPPorts),
			HostUDPPorts:    slices.Clone(p.HostUDPPorts),
		}
	}
}

// WithEgress sets the daemon's part of every lease's egress policy, which
// Ensure writes into the table's always-allowed and always-denied sets and
// SetEgress's chains read (default: none).
func WithEgress(d egress.Defaults) Option {
	return func(t *Table) {
		t.egress = egress.Defaults{AlwaysAllow: slices.Clone(d.AlwaysAllow), AlwaysDeny: slices.Clone(d.AlwaysDeny), ProxyPort: d.ProxyPort}
		// IPv6: the table's own (WithSlotNetwork6), set by New.
	}
}

// WithSlotNetwork names the network the slots' addresses are cut from, so
// that the rule against link-local destinations (LinkLocal) spares the
// slots' own gateways when that network is link-local itself, as the
// daemon's default is. Slot-to-slot traffic has its own rule.
func WithSlotNetwork(cidr netip.Prefix) Option {
	return func(t *Table) { t.slotNet = cidr.Masked() }
}

// WithSlotNetwork6 names the IPv6 network the slots' /127s are cut from
// (dual-stack slots): the table then polices their IPv6 as their IPv4
// (rules6), the egress policies' IPv6 CIDRs included. Without it every
// IPv6 packet a slot sends is dropped, and a policy with an IPv6 CIDR is
// refused (egress.Defaults.Admit).
func WithSlotNetwork6(cidr netip.Prefix) Option {
	return func(t *Table) { t.slotNet6 = cidr.Masked() }
}

// WithNetNS makes the Table work in the network namespace bound at path
// (a netns file, or /proc/<pid>/ns/net) instead of the caller's. The path is
// opened for each transaction and closed after it.
func WithNetNS(path string) Option {
	return func(t *Table) { t.netns = path }
}

// Table is a handle on one per-prefix inet table. It holds no socket and no
// descriptor: every method opens a netlink socket for its own transaction
// and closes it. A Table is safe for concurrent use.
type Table struct {
	name      string
	isolation Isolation
	egress    egress.Defaults
	slotNet   netip.Prefix
	slotNet6  netip.Prefix // WithSlotNetwork6; invalid: the slots have no IPv6
	netns     string
	stamp     string // WithStamp: the slots made under it are in its stamp set
	changes   group  // the policy changes committed together
	// bigBuf: a socket of this table had its receive buffer forced to
	// sockBuf, so a transaction may remove more chains (chainsPerTx).
	bigBuf atomic.Bool
}

// New returns a handle on the inet table called name. Nothing is created
// until Ensure.
func New(name string, opts ...Option) (*Table, error) {
	if name == "" || len(name) > 255 {
		return nil, fmt.Errorf("nft: invalid table name %q", name)
	}
	t := &Table{name: name}
	for _, o := range opts {
		o(t)
	}
	if err := t.isolation.Validate(); err != nil {
		return nil, err
	}
	t.egress.IPv6 = t.slotNet6.IsValid()

	if t.stamp != "" && !validStamp(t.stamp) {
		return nil, fmt.Errorf("nft: stamp %q: 1 to 64 letters, digits and underscores", t.stamp)
	}
	return t, nil
}

// Name returns the table's name.
func (t *Table) Name() string { return t.name }

// Isolation returns the isolation Ensure writes.
func (t *Table) Isolation() Isolation { return t.isolation }

// EgressDefaults returns the egress defaults Ensure writes, with the
// ranges the rule against link-local destinations drops (LinkLocal but
// the slot network) as their LinkLocal: what a policy lets out depends on
// them (egress.Narrow).
func (t *Table) EgressDefaults() egress.Defaults {
	d := t.egress
	d.LinkLocal = []netip.Prefix{LinkLocal}
	if t.slotNet.IsValid() {
		d.LinkLocal = egress.Without(LinkLocal, t.slotNet)
	}
	return d
}

func (t *Table) table() *nftables.Table {
	return &nftables.Table{Name: t.name, Family: nftables.TableFamilyINet}
}

// Fixed, non-zero set IDs keep the library from using its global counter;
// they only matter within the transaction that creates the set.
// The slots set carries its key's byte order (host, as for every string
// type) in its user data, as nft writes it for `type ifname`: the kernel
// ignores it, but without it nft and every tool that reads the ruleset
// list each name as "" (see byteOrderHost).
func (t *Table) set() *nftables.Set {
	return &nftables.Set{Table: t.table(), Name: SetName, ID: 1, KeyType: nftables.TypeIFName,
		KeyByteOrder: binaryutil.NativeEndian}
}

func (t *Table) portSet(name string, id uint32) *nftables.Set {
	return &nftables.Set{Table: t.table(), Name: name, ID: id, KeyType: nftables.TypeInetService}
}

// addrSet is an interval set of IPv4 addresses (the egress defaults').
func (t *Table) addrSet(name string, id uint32) *nftables.Set {
	return &nftables.Set{Table: t.table(), Name: name, ID: id, KeyType: nftables.TypeIPAddr, Interval: true}
}

// addrSet6 is an interval set of IPv6 addresses (the always-denied set's
// IPv6 ranges).
func (t *Table) addrSet6(name string, id uint32) *nftables.Set {
	return &nftables.Set{Table: t.table(), Name: name, ID: id, KeyType: nftables.TypeIP6Addr, Interval: true}
}

// egressMap maps a slot's host interface to a jump to its egress chain.
// Its key carries the byte order nft needs to print names, as the slots
// set's does.
func (t *Table) egressMap() *nftables.Set {
	return &nftables.Set{Table: t.table(), Name: MapEgress, ID: 6, IsMap: true, KeyType: nftables.TypeIFName,
		DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.NativeEndian}
}

// conn opens a netlink connection in the table's namespace. The returned
// release closes the namespace descriptor, if one was opened; the library
// opens and closes its socket per request.
func (t *Table) conn() (c *nftables.Conn, release func(), err error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(func(c *mnl.Conn) error {
		_ = c.SetWriteBuffer(sockBuf) // best effort
		_ = c.SetReadBuffer(sockBuf)
		// SO_RCVBUF is capped at net.core.rmem_max (208 KiB by default);
		// root may ask past it, which the acknowledgements of a large
		// transaction need (best effort: chainsPerTx bounds them
		// anyway).
		if rc, err := c.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) {
				if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sockBuf) == nil {
					t.bigBuf.Store(true)
				}
			})
		}
		return nil
	})}
	release = func() {}
	if t.netns != "" {
		fd, err := unix.Open(t.netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("nft: open netns %s: %w", t.netns, err)
		}
		opts = append(opts, nftables.WithNetNSFd(fd))
		release = func() { unix.Close(fd) }
	}
	c, err = nftables.New(opts...)
	if err != nil {
		release()
		return nil, nil, fmt.Errorf("nft: open netlink: %w", err)
	}
	return c, release, nil
}

// connFor is conn for a call made under ctx: none once ctx has ended.
func (t *Table) connFor(ctx context.Context) (*nftables.Conn, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	return t.conn()
}

// Conn opens a netlink connection in the table's namespace for a package
// that keeps objects of its own in this table (package ports: its maps
// and chains go away with the table). release closes what Conn opened.
func (t *Table) Conn(ctx context.Context) (c *nftables.Conn, release func(), err error) {
	return t.connFor(ctx)
}

// NetNS is the path WithNetNS gave; "" for the caller's namespace.
func (t *Table) NetNS() string { return t.netns }

// Exists reports whether the table exists with its set.
func (t *Table) Exists(ctx context.Context) (bool, error) {
	c, release, err := t.connFor(ctx)
	if err != nil {
		return false, err
	}
	defer release()
	if _, err := c.GetSetByName(t.table(), SetName); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("nft: get set %s/%s: %w", t.name, SetName, err)
	}
	return true, nil
}

func policy(p nftables.ChainPolicy) *nftables.ChainPolicy { return &p }

// Delete removes the table with everything in it. A missing table is not an
// error.
func (t *Table) Delete(ctx context.Context) error {
	c, release, err := t.connFor(ctx)
	if err != nil {
		return err
	}
	defer release()
	c.DelTable(t.table())
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nft: delete table inet %s: %w", t.name, err)
	}
	return nil
}

// RuleCount returns the number of rules in the table's chains.
func (t *Table) RuleCount(ctx context.Context) (int, error) {
	rules, err := t.allRules(ctx)
	return len(rules), err
}

func (t *Table) allRules(ctx context.Context) ([]*nftables.Rule, error) {
	c, release, err := t.connFor(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	var out []*nftables.Rule
	for _, ch := range fixedChains() {
		rules, err := c.GetRules(t.table(), &nftables.Chain{Name: ch, Table: t.table()})
		if err != nil {
			return nil, fmt.Errorf("nft: list rules %s/%s: %w", t.name, ch, err)
		}
		out = append(out, rules...)
	}
	return out, nil
}

// Drops counts the packets the table's drop rules have dropped since the
// rules were last written (an Ensure that writes them resets the counters;
// one that finds the table as it would write it leaves them).
type Drops struct {
	// SlotToSlot: forwarded from one slot to another (always 0 when the
	// policy allows slot-to-slot traffic).
	SlotToSlot uint64
	// Inbound: forwarded to a slot from elsewhere, outside a connection the
	// slot opened or one the operator published with DNAT.
	Inbound uint64
	// ToHost: sent by a slot to an address of the host and not allowed.
	ToHost uint64
	// Spoofed: sent by a slot from a source address that is not its own.
	Spoofed uint64
	// LinkLocal: sent by a slot to a link-local address (the cloud
	// metadata service) that neither the daemon nor the lease allows.
	LinkLocal uint64
	// Loopback: sent by a slot to 127.0.0.0/8.
	Loopback uint64
	// Router6: ICMPv6 router advertisements and redirects sent by a
	// slot.
	Router6 uint64
}

// Drops reads the counters of the table's drop rules.
func (t *Table) Drops(ctx context.Context) (Drops, error) {
	rules, err := t.allRules(ctx)
	if err != nil {
		return Drops{}, err
	}
	var d Drops
	for _, r := range rules {
		comment, _ := userdata.GetString(r.UserData, userdata.TypeComment)
		var n uint64
		for _, e := range r.Exprs {
			if c, ok := e.(*expr.Counter); ok {
				n = c.Packets
			}
		}
		if c := d.counterOf(comment); c != nil {
			*c += n // two rules count into Router6, two into LinkLocal
		}
	}
	return d, nil
}

// counterOf is the field of d that counts the drop rule of that comment,
// nil for a rule that is none of them: the one table of which rule
// counts what.
func (d *Drops) counterOf(comment string) *uint64 {
	fields := [...]struct {
		comment string
		n       *uint64
	}{{commentSlotToSlot, &d.SlotToSlot}, {commentInbound, &d.Inbound}, {commentToHost, &d.ToHost},
		{commentSpoofed, &d.Spoofed}, {commentLinkLocal, &d.LinkLocal}, {commentLoopback, &d.Loopback},
		{commentRouter6, &d.Router6}}
	for _, f := range fields {
		if f.comment == comment {
			return f.n
		}
	}
	return nil
}
