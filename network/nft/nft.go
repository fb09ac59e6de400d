package nft

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
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
)

// Names of the port sets.
const (
	SetHostTCP = "host_tcp"
	SetHostUDP = "host_udp"
)

// Comments of the rules whose counters Drops reads.
const (
	commentSlotToSlot = "slot-to-slot"
	commentInbound    = "inbound"
	commentToHost     = "to-host"
)

// ctStatusDNAT is IPS_DST_NAT: the connection's destination was rewritten.
const ctStatusDNAT = 1 << 5

// Policy says what the table's rules let slots reach. The zero value is the
// default for a multi-tenant host: slots are isolated from one another and
// reach no port of the host (see the package doc).
type Policy struct {
	// AllowSlotToSlot accepts traffic between slots instead of dropping it.
	AllowSlotToSlot bool
	// HostTCPPorts and HostUDPPorts are ports of services on the host that
	// slots may reach at their gateway address (the host end of their
	// veth). Ports must be in [1, 65535].
	HostTCPPorts, HostUDPPorts []uint16
}

// Validate reports a port outside [1, 65535].
func (p Policy) Validate() error {
	for _, l := range [][]uint16{p.HostTCPPorts, p.HostUDPPorts} {
		if slices.Contains(l, 0) {
			return errors.New("nft: host port 0 is not a port")
		}
	}
	return nil
}

// Option configures a Table.
type Option func(*Table)

// WithPolicy sets the policy Ensure writes (default: the zero Policy).
func WithPolicy(p Policy) Option {
	return func(t *Table) {
		t.policy = Policy{
			AllowSlotToSlot: p.AllowSlotToSlot,
			HostTCPPorts:    slices.Clone(p.HostTCPPorts),
			HostUDPPorts:    slices.Clone(p.HostUDPPorts),
		}
	}
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
	name   string
	policy Policy
	netns  string
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
	if err := t.policy.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

// Name returns the table's name.
func (t *Table) Name() string { return t.name }

// Policy returns the policy Ensure writes.
func (t *Table) Policy() Policy { return t.policy }

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

// conn opens a netlink connection in the table's namespace. The returned
// release closes the namespace descriptor, if one was opened; the library
// opens and closes its socket per request.
func (t *Table) conn() (c *nftables.Conn, release func(), err error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(func(c *mnl.Conn) error {
		_ = c.SetWriteBuffer(sockBuf) // best effort
		_ = c.SetReadBuffer(sockBuf)
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

// Exists reports whether the table exists with its set.
func (t *Table) Exists(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	c, release, err := t.conn()
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

// Ensure makes the table match its policy in one transaction: the table,
// the sets and chains are created if missing, every chain is flushed and its
// rules written anew, and the port sets are replaced. The slots set and its
// elements are kept. Ensure is idempotent and safe on a table made by an
// earlier run with another policy.
//
// A slots set made by an earlier version, without the key information nft
// needs to print names (see byteOrderHost), is made again in the same
// transaction, with the elements it had: the kernel swaps the rules and
// the set at once, so no packet of a live slot ever meets a rule without
// its set or a set without its element.
func (t *Table) Ensure(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	readable, err := t.setKeyReadable(SetName)
	missing := errors.Is(err, unix.ENOENT)
	if err != nil && !missing {
		return err
	}
	c, release, err := t.conn()
	if err != nil {
		return err
	}
	defer release()
	slots := t.set()
	var keep []nftables.SetElement
	migrate := !missing && !readable
	if migrate {
		old, err := c.GetSetElements(slots)
		if err != nil {
			return fmt.Errorf("nft: list set %s/%s to make it again: %w", t.name, SetName, err)
		}
		for _, e := range old {
			keep = append(keep, nftables.SetElement{Key: e.Key})
		}
	}
	tbl := c.AddTable(t.table())
	tcp, udp := t.portSet(SetHostTCP, 2), t.portSet(SetHostUDP, 3)
	for _, s := range []*nftables.Set{tcp, udp} {
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("nft: add set %s: %w", s.Name, err)
		}
	}
	for _, ps := range []struct {
		set   *nftables.Set
		ports []uint16
	}{{tcp, t.policy.HostTCPPorts}, {udp, t.policy.HostUDPPorts}} {
		c.FlushSet(ps.set)
		if len(ps.ports) == 0 {
			continue
		}
		var els []nftables.SetElement
		for _, p := range slices.Compact(slices.Sorted(slices.Values(ps.ports))) {
			els = append(els, nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(p)})
		}
		if err := c.SetAddElements(ps.set, els); err != nil {
			return fmt.Errorf("nft: encode ports of %s: %w", ps.set.Name, err)
		}
	}
	accept := policy(nftables.ChainPolicyAccept)
	chains := map[string]*nftables.Chain{}
	for _, ch := range []*nftables.Chain{
		{Name: ChainForward, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter},
		{Name: ChainInput, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter},
		{Name: ChainPostrouting, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource},
	} {
		ch.Table, ch.Policy = tbl, accept
		chains[ch.Name] = c.AddChain(ch)
		c.FlushChain(ch)
	}
	// The rules that referred to an old slots set are gone (flushed
	// above, in this transaction), so it can be deleted and made again.
	if migrate {
		c.DelSet(slots)
	}
	if err := c.AddSet(slots, nil); err != nil {
		return fmt.Errorf("nft: add set %s: %w", slots.Name, err)
	}
	for chunk := range slices.Chunk(keep, elemsPerMessage) {
		if err := c.SetAddElements(slots, chunk); err != nil {
			return fmt.Errorf("nft: encode elements of %s: %w", slots.Name, err)
		}
	}
	for _, r := range t.rules(slots, tcp, udp) {
		r.Table, r.Chain = tbl, chains[r.Chain.Name]
		c.AddRule(r)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nft: write table inet %s: %w", t.name, err)
	}
	return nil
}

// rules returns the table's rules, in order, with Chain naming their chain.
func (t *Table) rules(slots, tcp, udp *nftables.Set) []*nftables.Rule {
	in := func(key expr.MetaKey, set *nftables.Set, invert bool) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: key, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: invert},
		}
	}
	iifSlot := in(expr.MetaKeyIIFNAME, slots, false)
	oifSlot := in(expr.MetaKeyOIFNAME, slots, false)
	ctState := []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
	ctDNAT := []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ctStatusDNAT),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
	// The packet's destination is an address of the interface it came in
	// on: the slot's own gateway.
	ownGateway := []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, FlagIIF: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
	l4 := func(proto byte) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		}
	}
	dport := func(set *nftables.Set) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
		}
	}
	echoRequest := append(l4(unix.IPPROTO_ICMP),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{8}}, // ICMP_ECHO
	)
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	drop := &expr.Verdict{Kind: expr.VerdictDrop}
	// Only drops are counted: Drops never mixes accepted packets in.
	slotToSlot := []expr.Any{&expr.Counter{}, drop}
	if t.policy.AllowSlotToSlot {
		slotToSlot = []expr.Any{accept}
	}
	rule := func(chain, comment string, parts ...[]expr.Any) *nftables.Rule {
		r := &nftables.Rule{Chain: &nftables.Chain{Name: chain}, Exprs: slices.Concat(parts...)}
		if comment != "" {
			r.UserData = userdata.AppendString(nil, userdata.TypeComment, comment)
		}
		return r
	}
	v := func(e ...expr.Any) []expr.Any { return e }
	return []*nftables.Rule{
		rule(ChainForward, commentSlotToSlot, iifSlot, oifSlot, slotToSlot),
		rule(ChainForward, "", iifSlot, v(accept)),
		rule(ChainForward, "", oifSlot, ctState, v(accept)),
		rule(ChainForward, "", oifSlot, ctDNAT, v(accept)),
		rule(ChainForward, commentInbound, oifSlot, v(&expr.Counter{}, drop)),

		rule(ChainInput, "", iifSlot, ctState, v(accept)),
		rule(ChainInput, "", iifSlot, echoRequest, ownGateway, v(accept)),
		rule(ChainInput, "", iifSlot, l4(unix.IPPROTO_TCP), dport(tcp), ownGateway, v(accept)),
		rule(ChainInput, "", iifSlot, l4(unix.IPPROTO_UDP), dport(udp), ownGateway, v(accept)),
		rule(ChainInput, commentToHost, iifSlot, v(&expr.Counter{}, drop)),

		rule(ChainPostrouting, "", iifSlot, in(expr.MetaKeyOIFNAME, slots, true), v(&expr.Masq{})),
	}
}

func policy(p nftables.ChainPolicy) *nftables.ChainPolicy { return &p }

// Delete removes the table with everything in it. A missing table is not an
// error.
func (t *Table) Delete(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, release, err := t.conn()
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
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, release, err := t.conn()
	if err != nil {
		return nil, err
	}
	defer release()
	var out []*nftables.Rule
	for _, ch := range []string{ChainForward, ChainInput, ChainPostrouting} {
		rules, err := c.GetRules(t.table(), &nftables.Chain{Name: ch, Table: t.table()})
		if err != nil {
			return nil, fmt.Errorf("nft: list rules %s/%s: %w", t.name, ch, err)
		}
		out = append(out, rules...)
	}
	return out, nil
}

// Drops counts the packets the table's drop rules have dropped since the
// rules were last written (Ensure resets the counters).
type Drops struct {
	// SlotToSlot: forwarded from one slot to another (always 0 when the
	// policy allows slot-to-slot traffic).
	SlotToSlot uint64
	// Inbound: forwarded to a slot from elsewhere, outside a connection the
	// slot opened or one the operator published with DNAT.
	Inbound uint64
	// ToHost: sent by a slot to an address of the host and not allowed.
	ToHost uint64
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
		switch comment {
		case commentSlotToSlot:
			d.SlotToSlot = n
		case commentInbound:
			d.Inbound = n
		case commentToHost:
			d.ToHost = n
		}
	}
	return d, nil
}

func key(name string) ([]byte, error) {
	if name == "" || len(name) >= ifNameSize {
		return nil, fmt.Errorf("nft: invalid interface name %q", name)
	}
	k := make([]byte, ifNameSize)
	copy(k, name)
	return k, nil
}

func elements(names []string) ([]nftables.SetElement, error) {
	els := make([]nftables.SetElement, 0, len(names))
	for _, n := range names {
		k, err := key(n)
		if err != nil {
			return nil, err
		}
		els = append(els, nftables.SetElement{Key: k})
	}
	return els, nil
}

// List returns the interface names in the set, sorted. A missing table gives
// an empty list.
func (t *Table) List(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, release, err := t.conn()
	if err != nil {
		return nil, err
	}
	defer release()
	els, err := c.GetSetElements(t.set())
	if err != nil {
		// The library does not always wrap the errno: ask whether the set
		// is there at all.
		if ok, xerr := t.Exists(ctx); errors.Is(err, unix.ENOENT) || (xerr == nil && !ok) {
			return nil, nil
		}
		return nil, fmt.Errorf("nft: list set %s/%s: %w", t.name, SetName, err)
	}
	out := make([]string, 0, len(els))
	for _, e := range els {
		n := string(e.Key)
		if i := strings.IndexByte(n, 0); i >= 0 {
			n = n[:i]
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// Add adds interface names to the set in one transaction. Names already in
// the set are fine.
func (t *Table) Add(ctx context.Context, names ...string) error {
	return t.change(ctx, names, true)
}

// Remove removes interface names from the set in one transaction. Names not
// in the set are skipped: with more than one name the set is listed first and
// only present names are removed (retrying if the set changed meanwhile); a
// single missing name is simply success. A missing table is success.
func (t *Table) Remove(ctx context.Context, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	if len(names) == 1 {
		err := t.change(ctx, names, false)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	var last error
	for range 3 {
		present, err := t.List(ctx)
		if err != nil {
			return err
		}
		have := make(map[string]bool, len(present))
		for _, p := range present {
			have[p] = true
		}
		var del []string
		for _, n := range names {
			if have[n] {
				del = append(del, n)
				delete(have, n) // no duplicates in one batch
			}
		}
		last = t.change(ctx, del, false)
		if !errors.Is(last, unix.ENOENT) {
			return last
		}
	}
	return last
}

func (t *Table) change(ctx context.Context, names []string, add bool) error {
	if len(names) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	els, err := elements(names)
	if err != nil {
		return err
	}
	c, release, err := t.conn()
	if err != nil {
		return err
	}
	defer release()
	set := t.set()
	for chunk := range slices.Chunk(els, elemsPerMessage) {
		if add {
			err = c.SetAddElements(set, chunk)
		} else {
			err = c.SetDeleteElements(set, chunk)
		}
		if err != nil {
			return fmt.Errorf("nft: encode elements: %w", err)
		}
	}
	if err := c.Flush(); err != nil {
		op := "remove"
		if add {
			op = "add"
		}
		return fmt.Errorf("nft: %s %d element(s) in %s/%s: %w", op, len(names), t.name, SetName, err)
	}
	return nil
}
