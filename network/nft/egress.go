package nft

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/internal/nftexpr"
)

// inlineMax is the longest list of a policy written as a rule per range;
// a longer one is an anonymous interval set. Making an anonymous set costs
// a walk of every set of the table (the kernel picks its name by scanning
// them all), so with thousands of leases a set per list made every policy
// change cost milliseconds; a handful of rules costs nothing to write and
// a few comparisons per packet (docs/BENCHMARKS.md, "The per-slot host
// rules").
const inlineMax = 8

// egressChainPrefix starts the name of every slot's egress chain.
const egressChainPrefix = "egress_"

// EgressChain names the egress chain of the slot whose host interface is
// name.
func EgressChain(name string) string { return egressChainPrefix + name }

// SetEgress writes the egress policy p of the slot whose host interface is
// name as that slot's chain in the table, in one transaction: the chain is
// made or flushed, its rules written, and the egress map sends the slot's
// packets to it. A packet meets the old policy or the new one, never a
// mix, and connections already established stay up (chain egress accepts
// them first).
//
// The rules are those of the slot's own egress table (package inside,
// where the tenant's root could change them): the egress proxy with
// RedirectTCP, DenyAll, the lease's allow and deny lists, the daemon's
// always-denied set; the daemon's always-allowed set is accepted by chain
// egress before the map. The first rule's comment carries p's
// fingerprint with the table's defaults, which EgressOf reads back.
func (t *Table) SetEgress(ctx context.Context, name string, p egress.Policy) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k, err := key(name)
	if err != nil {
		return err
	}
	if err := t.egress.Admit(p); err != nil {
		return err
	}
	return t.changes.do(t, "egress chain "+EgressChain(name), func(c *nftables.Conn, ids *setIDs) error {
		tbl := t.table()
		ch := c.AddChain(&nftables.Chain{Name: EgressChain(name), Table: tbl})
		c.FlushChain(ch)
		rules, err := t.egressRules(c, ids, p)
		if err != nil {
			return err
		}
		for i, r := range rules {
			rule := &nftables.Rule{Table: tbl, Chain: ch, Exprs: r}
			if i == 0 {
				rule.UserData = nftexpr.FingerprintComment(p.Fingerprint(t.egress))
			}
			c.AddRule(rule)
		}
		// A replacement adds the element it has again, which the kernel
		// takes as a no-op (the same key and jump, without NLM_F_EXCL):
		// asking first would cost a round trip, and the commit checks
		// the whole table anyway, for the rules it adds (group).
		if err := c.SetAddElements(t.egressMap(), []nftables.SetElement{jumpTo(k, name)}); err != nil {
			return fmt.Errorf("nft: encode egress map element %s: %w", name, err)
		}
		return nil
	})
}

// hasEgress reports whether the slot whose host interface is name has an
// element in the egress map (and so its chain).
func (t *Table) hasEgress(name string) (bool, error) {
	k, err := key(name)
	if err != nil {
		return false, err
	}
	return t.hasElement(MapEgress, k)
}

// withEgress returns those of names that have an egress chain, each
// asked for alone (one element's GET each, not a listing of the map).
func (t *Table) withEgress(names []string) ([]string, error) {
	var out []string
	for _, n := range names {
		ok, err := t.hasEgress(n)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, n)
		}
	}
	return out, nil
}

// jumpTo is the egress map's element for the slot whose host interface is
// name (key k).
func jumpTo(k []byte, name string) nftables.SetElement {
	return nftables.SetElement{Key: k, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: EgressChain(name)}}
}

// egressRules is a slot's egress chain for p, in order (never empty: the
// always-denied set ends it, or DenyAll's drop); the anonymous sets of the
// lease's lists are added to c's transaction.
func (t *Table) egressRules(c *nftables.Conn, ids *setIDs, p egress.Policy) ([][]expr.Any, error) {
	accept := []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	// The daemon's always-allowed set is accepted before the map sends a
	// packet here (chain egress): a rule fewer in every lease's chain,
	// which the kernel walks at each commit that adds a rule.
	var rules [][]expr.Any
	if p.RedirectTCP {
		tcp := []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		}
		toProxy := []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(t.egress.ProxyPort)},
		}
		// What the slot's own table sends to the proxy at its gateway;
		// any other TCP connection is dropped here, so that a slot whose
		// own redirection was removed does not go around the proxy.
		rules = append(rules, slices.Concat(tcp, toProxy, ownGateway(), accept), slices.Concat(tcp, drop))
	}
	if p.DenyAll {
		return append(rules, drop), nil
	}
	for _, l := range []struct {
		list    []netip.Prefix
		verdict []expr.Any
	}{{p.Allow, accept}, {p.Deny, drop}} {
		for _, fam := range []family{ipv4Family, ipv6Family} {
			r, err := t.listRules(c, ids, fam, l.list, l.verdict)
			if err != nil {
				return nil, err
			}
			rules = append(rules, r...)
		}
	}
	rules = append(rules, slices.Concat(daddrIn(t.addrSet(SetAlwaysDeny, 0)), drop))
	if t.slotNet6.IsValid() {
		rules = append(rules, slices.Concat(daddrIn6(t.addrSet6(SetAlwaysDeny6, 0)), drop))
	}
	return rules, nil
}

// family is one address family's way to write a policy's list.
type family struct {
	is       func(netip.Prefix) bool
	inPrefix func(netip.Prefix) []expr.Any
	inSet    func(*nftables.Set) []expr.Any
	key      nftables.SetDatatype
	elements func([]netip.Prefix) []nftables.SetElement
}

var (
	ipv4Family = family{func(p netip.Prefix) bool { return p.Addr().Is4() },
		func(p netip.Prefix) []expr.Any { return daddrInPrefix(p, netip.Prefix{}) }, daddrIn, nftables.TypeIPAddr, nftexpr.IntervalElements}
	ipv6Family = family{func(p netip.Prefix) bool { return p.Addr().Is6() },
		daddrInPrefix6, daddrIn6, nftables.TypeIP6Addr, nftexpr.IntervalElements6}
)

// listRules writes the prefixes of family fam in list with verdict: a
// rule per prefix, or an anonymous interval set of them for a list longer
// than inlineMax (made in c's transaction). An empty list has none.
func (t *Table) listRules(c *nftables.Conn, ids *setIDs, fam family, list []netip.Prefix, verdict []expr.Any) ([][]expr.Any, error) {
	var of []netip.Prefix
	for _, p := range list {
		if fam.is(p) {
			of = append(of, p)
		}
	}
	var rules [][]expr.Any
	if len(of) <= inlineMax {
		// A rule per range: no set to make (see inlineMax).
		for _, r := range of {
			rules = append(rules, slices.Concat(fam.inPrefix(r), verdict))
		}
		return rules, nil
	}
	set := &nftables.Set{Table: t.table(), Name: "__set%d", ID: ids.next(), Anonymous: true, Constant: true,
		Interval: true, KeyType: fam.key}
	if err := c.AddSet(set, fam.elements(of)); err != nil {
		return nil, fmt.Errorf("nft: add egress set: %w", err)
	}
	return append(rules, slices.Concat(fam.inSet(set), verdict)), nil
}

// ClearEgress removes the egress chains of the slots whose host interfaces
// are names, and their entries in the egress map, in one transaction. A
// slot without one is fine, and so is a missing table.
func (t *Table) ClearEgress(ctx context.Context, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	names, err := t.withEgress(names)
	if err != nil || len(names) == 0 {
		return err
	}
	c, release, err := t.conn()
	if err != nil {
		return err
	}
	defer release()
	for part := range slices.Chunk(names, t.chainsPerTx()) {
		if err := t.clearEgress(c, part); err != nil {
			return err
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("nft: clear egress chains of %d slot(s) in %s: %w", len(part), t.name, err)
		}
	}
	return nil
}

// clearEgress adds to c's transaction the removal of the egress chains of
// names, which have one, and of their map elements. (Removing one that is not
// there would fail the whole transaction, and the kernel has no "delete if
// present" before Linux 6.3; adding it first to make the removal certain
// would put a jump in the map, which makes the kernel walk every slot's
// chain at the commit: callers ask what is there first.)
func (t *Table) clearEgress(c *nftables.Conn, names []string) error {
	if err := t.unmap(c, names); err != nil {
		return err
	}
	t.dropChains(c, names)
	return nil
}

// unmap adds to c's transaction the removal of the map elements of names,
// which have one: their chains are unreachable from then on.
func (t *Table) unmap(c *nftables.Conn, names []string) error {
	// By key alone: a message holds elemsPerMessage keys, where the
	// verdicts' chain names would take it past a netlink attribute's
	// 64 KiB.
	els, err := elements(names)
	if err != nil {
		return err
	}
	for chunk := range slices.Chunk(els, elemsPerMessage) {
		if err := c.SetDeleteElements(t.egressMap(), chunk); err != nil {
			return fmt.Errorf("nft: encode egress map elements: %w", err)
		}
	}
	return nil
}

// dropChains adds to c's transaction the removal of the egress chains of
// names, which no map element refers to any longer (unmap).
func (t *Table) dropChains(c *nftables.Conn, names []string) {
	for _, n := range names {
		ch := &nftables.Chain{Name: EgressChain(n), Table: t.table()}
		c.FlushChain(ch)
		c.DelChain(ch)
	}
}

// chainsPerTransaction bounds the egress chains one transaction removes.
// Every message of a transaction is acknowledged, two per chain, and the
// acknowledgements of thousands overflow the netlink socket's receive
// buffer before they are read (ENOBUFS: a teardown of 10,000 leased slots
// failed so, its socket's buffer capped at net.core.rmem_max); a removal
// of more is split, each part one transaction. 128 chains' 256
// acknowledgements fit the default rmem_max (208 KiB); where the buffer
// was forced to sockBuf (root), a transaction takes
// chainsPerBigTransaction: each transaction has a fixed cost in the
// kernel, which made 128 a transaction three times slower at 10,000
// chains (figures: docs/BENCHMARKS.md, "Decommission at the kernel's
// rate").
const (
	chainsPerTransaction    = 128
	chainsPerBigTransaction = 1024
)

// chainsPerTx is how many chains one transaction of t removes: more once
// a socket of t has had its receive buffer forced to sockBuf (2,048
// acknowledgements take about 2 MiB of its 8).
func (t *Table) chainsPerTx() int {
	if t.bigBuf.Load() {
		return chainsPerBigTransaction
	}
	return chainsPerTransaction
}

// EgressState is what the table holds of one slot's egress policy.
type EgressState struct {
	// Fingerprint is the written policy's (egress.Policy.Fingerprint with
	// the table's defaults); "" when the slot has no egress chain.
	Fingerprint string
	// Drops counts the packets the chain dropped since it was written.
	Drops uint64
}

// EgressOf reads the egress chain of the slot whose host interface is
// name; the zero EgressState when it has none.
func (t *Table) EgressOf(ctx context.Context, name string) (EgressState, error) {
	c, release, err := t.connFor(ctx)
	if err != nil {
		return EgressState{}, err
	}
	defer release()
	rules, err := c.GetRules(t.table(), &nftables.Chain{Name: EgressChain(name), Table: t.table()})
	if errors.Is(err, unix.ENOENT) || (err == nil && len(rules) == 0) {
		return EgressState{}, nil
	}
	if err != nil {
		return EgressState{}, fmt.Errorf("nft: list egress chain %s/%s: %w", t.name, EgressChain(name), err)
	}
	st := EgressState{Fingerprint: nftexpr.Fingerprint(rules[0].UserData)}
	for _, r := range rules {
		for _, e := range r.Exprs {
			if n, ok := e.(*expr.Counter); ok {
				st.Drops += n.Packets
			}
		}
	}
	return st, nil
}

// EgressNames returns the host interfaces of the slots with an egress
// chain, sorted, as the egress map lists them. A missing table lists none.
func (t *Table) EgressNames(ctx context.Context) ([]string, error) {
	return t.names(ctx, t.egressMap())
}

func (t *Table) egressNames(ctx context.Context, c *nftables.Conn) ([]string, error) {
	return t.keys(ctx, c, t.egressMap())
}

// elementNames returns the interface names that els are keyed by, sorted.
func elementNames(els []nftables.SetElement) []string {
	out := make([]string, 0, len(els))
	for _, e := range els {
		out = append(out, keyName(e.Key))
	}
	slices.Sort(out)
	return out
}

// keyName is the interface name an ifname key holds.
func keyName(k []byte) string {
	n := string(k)
	if i := strings.IndexByte(n, 0); i >= 0 {
		n = n[:i]
	}
	return n
}
