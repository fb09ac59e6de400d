package nft

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/nftexpr"
)

// Ensure makes the table match its policy in one transaction (the table
// needs its slot network, WithSlotNetwork): the table,
// the sets and chains are created if missing, every fixed chain is flushed
// and its rules written anew, and the port and egress-default sets are
// replaced. The slots set and the egress map keep their elements, and the
// slots' own egress chains (SetEgress) are left as they are. Ensure is
// idempotent and safe on a table made by an earlier run with another
// policy.
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
	if !t.slotNet.IsValid() {
		return fmt.Errorf("nft: table %s: no slot network (WithSlotNetwork): the rule against link-local destinations would catch the slots' own gateways", t.name)
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
	if readable && t.written(c) {
		// As a start finds the table its last run left: writing it again
		// would make the kernel walk every lease's egress chain at the
		// commit, for nothing (the cost with 10,000 leases:
		// docs/BENCHMARKS.md, "Restart with 10,000 leases").
		return t.ensureStampSet(c)
	}
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
	sets, err := t.writeFixedSets(c)
	if err != nil {
		return err
	}
	chains := t.flushFixedChains(c, tbl)
	// The rules that referred to an old slots set are gone (flushed
	// above, in this transaction), so it can be deleted and made again.
	if migrate {
		c.DelSet(slots)
	}
	if err := c.AddSet(slots, nil); err != nil {
		return fmt.Errorf("nft: add set %s: %w", slots.Name, err)
	}
	if st := t.stampSet(); st != nil {
		if err := c.AddSet(st, nil); err != nil {
			return fmt.Errorf("nft: add set %s: %w", st.Name, err)
		}
	}
	for chunk := range slices.Chunk(keep, elemsPerMessage) {
		if err := c.SetAddElements(slots, chunk); err != nil {
			return fmt.Errorf("nft: encode elements of %s: %w", slots.Name, err)
		}
	}
	sets.slots = slots
	for _, r := range t.rules(sets) {
		r.Table, r.Chain = tbl, chains[r.Chain.Name]
		c.AddRule(r)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nft: write table inet %s: %w", t.name, err)
	}
	return nil
}

// rulesVersion names the fixed rules rules() writes: a change of rules()
// comes with a new version, so that a table an earlier build wrote is
// written again at the next start (written). 3: chain egress accepts the
// always-allowed set before its map, no longer after. 4: published ports
// (package ports): chain antispoof drops what a slot sends to 127.0.0.0/8,
// and chain forward accepts a DNAT'd connection from a slot to a slot.
// 5: IPv6 (rules6).
const rulesVersion = 5

// layout is a fingerprint of what Ensure writes: the rules' version, the
// policy, the slot network and the egress defaults as their sets hold
// them. The first rule of chain egress carries it in its comment.
func (t *Table) layout() string {
	h := sha256.New()
	ports := func(ps []uint16) []uint16 { return slices.Compact(slices.Sorted(slices.Values(ps))) }
	fmt.Fprintf(h, "v%d %d slot-to-slot %t tcp %v udp %v net %s net6 %s\n", rulesVersion, FixedRules,
		t.isolation.AllowSlotToSlot, ports(t.isolation.HostTCPPorts), ports(t.isolation.HostUDPPorts), t.slotNet, t.slotNet6)
	for _, els := range [][]nftables.SetElement{nftexpr.IntervalElements(t.egress.AlwaysAllow),
		nftexpr.IntervalElements(t.egress.AlwaysDeny), nftexpr.IntervalElements6(t.egress.AlwaysDeny)} {
		for _, e := range els {
			fmt.Fprintf(h, "%x %t,", e.Key, e.IntervalEnd)
		}
		fmt.Fprintln(h)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// layoutPrefix starts the comment that carries layout.
const layoutPrefix = "table "

// written reports whether the table already holds what Ensure would write:
// its fixed chains hold their FixedRules rules, and chain egress's first
// carries this table's layout. A table an earlier build, or another
// policy, wrote is not.
func (t *Table) written(c *nftables.Conn) bool {
	n := 0
	for _, ch := range fixedChains() {
		rules, err := c.GetRules(t.table(), &nftables.Chain{Name: ch, Table: t.table()})
		if err != nil {
			return false
		}
		if ch == ChainEgress {
			if len(rules) == 0 {
				return false
			}
			if comment, _ := userdata.GetString(rules[0].UserData, userdata.TypeComment); comment != layoutPrefix+t.layout() {
				return false
			}
		}
		n += len(rules)
	}
	return n == FixedRules
}

// fixedChains are the table's base chains, in the order of rules().
func fixedChains() [5]string {
	return [5]string{ChainSpoof, ChainEgress, ChainForward, ChainInput, ChainPostrouting}
}

// FixedRules is how many rules the table's fixed chains hold, whatever
// the number of slots: antispoof 2, egress 8 (4 of them IPv6's, rules6),
// forward 6, input 7 (2 IPv6's), postrouting 1. The slots' own egress
// chains come on top.
const FixedRules = 24

// fixedSets are the sets the fixed rules look up.
type fixedSets struct {
	slots, tcp, udp, alwaysAllow, egress *nftables.Set
}

// writeFixedSets adds the port sets and the egress defaults' sets with
// their elements replaced, and the egress map, whose elements are kept.
func (t *Table) writeFixedSets(c *nftables.Conn) (fixedSets, error) {
	s := fixedSets{
		tcp:         t.portSet(SetHostTCP, 2),
		udp:         t.portSet(SetHostUDP, 3),
		alwaysAllow: t.addrSet(SetAlwaysAllow, 4),
		egress:      t.egressMap(),
	}
	var ports [2][]nftables.SetElement
	for k, list := range [][]uint16{t.isolation.HostTCPPorts, t.isolation.HostUDPPorts} {
		for _, p := range slices.Compact(slices.Sorted(slices.Values(list))) {
			ports[k] = append(ports[k], nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(p)})
		}
	}
	for _, w := range []struct {
		set *nftables.Set
		els []nftables.SetElement
	}{
		{s.tcp, ports[0]},
		{s.udp, ports[1]},
		{s.alwaysAllow, nftexpr.IntervalElements(t.egress.AlwaysAllow)},
		{t.addrSet(SetAlwaysDeny, 5), nftexpr.IntervalElements(t.egress.AlwaysDeny)},
		{t.addrSet6(SetAlwaysDeny6, 8), nftexpr.IntervalElements6(t.egress.AlwaysDeny)},
	} {
		if err := c.AddSet(w.set, nil); err != nil {
			return s, fmt.Errorf("nft: add set %s: %w", w.set.Name, err)
		}
		c.FlushSet(w.set)
		for chunk := range slices.Chunk(w.els, elemsPerMessage) {
			if err := c.SetAddElements(w.set, chunk); err != nil {
				return s, fmt.Errorf("nft: encode elements of %s: %w", w.set.Name, err)
			}
		}
	}
	if err := c.AddSet(s.egress, nil); err != nil {
		return s, fmt.Errorf("nft: add map %s: %w", s.egress.Name, err)
	}
	return s, nil
}

// flushFixedChains adds the base chains, flushed, by name.
func (t *Table) flushFixedChains(c *nftables.Conn, tbl *nftables.Table) map[string]*nftables.Chain {
	accept := policy(nftables.ChainPolicyAccept)
	chains := map[string]*nftables.Chain{}
	for _, ch := range []*nftables.Chain{
		{Name: ChainSpoof, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw},
		{Name: ChainEgress, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle},
		{Name: ChainForward, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter},
		{Name: ChainInput, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter},
		{Name: ChainPostrouting, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource},
	} {
		ch.Table, ch.Policy = tbl, accept
		chains[ch.Name] = c.AddChain(ch)
		c.FlushChain(ch)
	}
	return chains
}

// rules returns the table's fixed rules, in order, with Chain naming
// their chain.
func (t *Table) rules(sets fixedSets) []*nftables.Rule {
	iifSlot := lookup(expr.MetaKeyIIFNAME, sets.slots, false)
	oifSlot := lookup(expr.MetaKeyOIFNAME, sets.slots, false)
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
	// The source address is routed back through the interface the packet
	// came in on: a slot's own inside address, never another slot's, the
	// host's or anyone else's (a strict reverse-path check, rp_filter=1,
	// in this table whatever the host's sysctls).
	ownSource := []expr.Any{
		&expr.Fib{Register: 1, FlagSADDR: true, FlagIIF: true, ResultOIF: true, FlagPRESENT: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
	egressVmap := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: sets.egress.Name, SetID: sets.egress.ID, IsDestRegSet: true, DestRegister: 0},
	}
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	drop := &expr.Verdict{Kind: expr.VerdictDrop}
	// Only drops are counted: Drops never mixes accepted packets in.
	slotToSlot := []expr.Any{&expr.Counter{}, drop}
	if t.isolation.AllowSlotToSlot {
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
	v6 := t.rules6(iifSlot, rule)
	return slices.Concat([]*nftables.Rule{
		rule(ChainSpoof, commentSpoofed, iifSlot, ownSource, v(&expr.Counter{}, drop)),
		// The host end of a slot with a published port routes 127/8
		// (route_localnet, package ports): nothing from the slot may.
		rule(ChainSpoof, commentLoopback, iifSlot, daddrInPrefix(Loopback, netip.Prefix{}), v(&expr.Counter{}, drop)),

		rule(ChainEgress, layoutPrefix+t.layout(), iifSlot, nftexpr.CtState(), v(accept)),
	}, v6.egressFirst, []*nftables.Rule{
		rule(ChainEgress, "", iifSlot, daddrIn(sets.alwaysAllow), v(accept)),
		rule(ChainEgress, "", iifSlot, egressVmap),
		rule(ChainEgress, commentLinkLocal, iifSlot, daddrInPrefix(LinkLocal, t.slotNet), v(&expr.Counter{}, drop)),
	}, v6.egressLast, []*nftables.Rule{

		// A published port (package ports) is reached at the host's
		// address by anyone, a slot too, and hairpin from its own slot:
		// only a connection the table's maps DNAT'd to it.
		rule(ChainForward, "", iifSlot, oifSlot, ctStatus(ctStatusDNAT), v(accept)),
		rule(ChainForward, commentSlotToSlot, iifSlot, oifSlot, slotToSlot),
		rule(ChainForward, "", iifSlot, v(accept)),
		rule(ChainForward, "", oifSlot, nftexpr.CtState(), v(accept)),
		rule(ChainForward, "", oifSlot, ctStatus(ctStatusDNAT), v(accept)),
		rule(ChainForward, commentInbound, oifSlot, v(&expr.Counter{}, drop)),

		rule(ChainInput, "", iifSlot, nftexpr.CtState(), v(accept)),
	}, v6.input, []*nftables.Rule{
		rule(ChainInput, "", iifSlot, echoRequest, ownGateway(), v(accept)),
		rule(ChainInput, "", iifSlot, l4(unix.IPPROTO_TCP), dport(sets.tcp), ownGateway(), v(accept)),
		rule(ChainInput, "", iifSlot, l4(unix.IPPROTO_UDP), dport(sets.udp), ownGateway(), v(accept)),
		rule(ChainInput, commentToHost, iifSlot, v(&expr.Counter{}, drop)),

		rule(ChainPostrouting, "", iifSlot, lookup(expr.MetaKeyOIFNAME, sets.slots, true), v(&expr.Masq{})),
	})
}

// lookup matches an interface name (key) against set.
func lookup(key expr.MetaKey, set *nftables.Set, invert bool) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: invert},
	}
}

// ctStatus matches a connection whose status has bit set.
func ctStatus(bit uint32) []expr.Any { return nftexpr.CtBits(expr.CtKeySTATUS, bit) }

// ownGateway matches a packet whose destination is an address of the
// interface it came in on: the slot's own gateway.
func ownGateway() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, FlagIIF: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// ipv4 matches IPv4 packets: the payload matches below read IPv4 headers.
func ipv4() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}}}
}

// daddrIn matches an IPv4 destination in set.
func daddrIn(set *nftables.Set) []expr.Any {
	return append(ipv4(),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	)
}

// daddrInPrefix matches an IPv4 destination in p, but not in except
// (when except is a valid prefix inside p).
func daddrInPrefix(p, except netip.Prefix) []expr.Any {
	e := ipv4()
	for _, m := range []struct {
		p  netip.Prefix
		op expr.CmpOp
	}{{p, expr.CmpOpEq}, {except, expr.CmpOpNeq}} {
		if m.op == expr.CmpOpNeq && (!m.p.IsValid() || !p.Overlaps(m.p)) {
			continue
		}
		var mask [4]byte
		for b := range m.p.Bits() {
			mask[b/8] |= 0x80 >> (b % 8)
		}
		net := m.p.Masked().Addr().As4()
		e = append(e,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask[:], Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: m.op, Register: 1, Data: net[:]},
		)
	}
	return e
}
