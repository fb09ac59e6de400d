package ports

import (
	"context"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/nftexpr"
	"github.com/phasegate/phasegate/network/nft"
)

// Names of the maps and chains this package keeps in the slot table.
const (
	MapAny          = "ports_any"
	MapAddr         = "ports_addr"
	ChainPrerouting = "ports_prerouting"
	ChainOutput     = "ports_output"
	ChainPostroute  = "ports_postrouting"
)

// Rules is how many rules the chains hold, whatever the number of
// mappings: prerouting 2, output 2, postrouting 2.
const Rules = 6

// ctStatusDNAT is IPS_DST_NAT: the connection's destination was rewritten.
const ctStatusDNAT = 1 << 5

var (
	keyAny  = nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	keyAddr = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)
	target  = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)
)

// Table is the published ports of one slot table (package nft's): its two
// maps and three chains. It holds no socket: each call opens its own
// (nft.Table.Conn). A Table is safe for concurrent use.
type Table struct {
	fw *nft.Table
}

// New returns the published ports of the slot table fw. Nothing is made
// until Ensure.
func New(fw *nft.Table) *Table { return &Table{fw: fw} }

func (t *Table) table() *nftables.Table {
	return &nftables.Table{Name: t.fw.Name(), Family: nftables.TableFamilyINet}
}

// maps are the two maps, by name: ports_any (ID 21) and ports_addr (22).
// The IDs matter only within the transaction that makes them.
func (t *Table) maps() (anyMap, addrMap *nftables.Set) {
	anyMap = &nftables.Set{Table: t.table(), Name: MapAny, ID: 21, IsMap: true, Concatenation: true, KeyType: keyAny, DataType: target}
	addrMap = &nftables.Set{Table: t.table(), Name: MapAddr, ID: 22, IsMap: true, Concatenation: true, KeyType: keyAddr, DataType: target}
	return anyMap, addrMap
}

// Ensure makes the maps and chains in the slot table, which must exist
// (nft.Table.Ensure), in one transaction: the chains are flushed and their
// rules written anew, the maps keep their elements. It is idempotent and
// safe on a table an earlier run wrote.
func (t *Table) Ensure(ctx context.Context) error {
	c, release, err := t.fw.Conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	tbl := t.table()
	anyMap, addrMap := t.maps()
	for _, m := range []*nftables.Set{anyMap, addrMap} {
		if err := c.AddSet(m, nil); err != nil {
			return fmt.Errorf("ports: add map %s: %w", m.Name, err)
		}
	}
	accept := nftables.ChainPolicyAccept
	chains := map[string]*nftables.Chain{}
	for _, ch := range []*nftables.Chain{
		{Name: ChainPrerouting, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest},
		{Name: ChainOutput, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest},
		{Name: ChainPostroute, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource},
	} {
		ch.Table, ch.Type, ch.Policy = tbl, nftables.ChainTypeNAT, &accept
		chains[ch.Name] = c.AddChain(ch)
		c.FlushChain(ch)
	}
	for _, r := range rules(anyMap, addrMap) {
		r.Table, r.Chain = tbl, chains[r.Chain.Name]
		c.AddRule(r)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("ports: write the chains of table inet %s: %w", t.fw.Name(), err)
	}
	return nil
}

// rules are the chains' rules, in order, with Chain naming their chain.
func rules(anyMap, addrMap *nftables.Set) []*nftables.Rule {
	ipv4 := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
	localDst := []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
	// The key is loaded field by field into 32-bit registers from 8 (the
	// 16-byte register 1's first; reg counts from there), each field
	// padded to 4 bytes, as nft loads a concatenation; the map's value,
	// address . port, lands in registers 8 and 9, where the NAT reads it.
	protoPort := func(reg uint32) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
			&expr.Payload{DestRegister: reg + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		}
	}
	dnat := func(m *nftables.Set) []expr.Any {
		return []expr.Any{
			&expr.Lookup{SourceRegister: 1, SetName: m.Name, SetID: m.ID, IsDestRegSet: true, DestRegister: 1},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 9, Specified: true},
		}
	}
	daddr := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}}
	byAddr := slices.Concat(ipv4, daddr, protoPort(9), dnat(addrMap))
	onAny := slices.Concat(ipv4, localDst, protoPort(8), dnat(anyMap))
	slotIf := func(key expr.MetaKey) []expr.Any {
		return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Lookup{SourceRegister: 1, SetName: nft.SetName}}
	}
	fromLoopback := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{127}},
	}
	dnatted := nftexpr.CtBits(expr.CtKeySTATUS, ctStatusDNAT)
	masq := []expr.Any{&expr.Masq{}}
	rule := func(chain string, parts ...[]expr.Any) *nftables.Rule {
		return &nftables.Rule{Chain: &nftables.Chain{Name: chain}, Exprs: slices.Concat(parts...)}
	}
	return []*nftables.Rule{
		rule(ChainPrerouting, byAddr),
		rule(ChainPrerouting, onAny),
		rule(ChainOutput, byAddr),
		rule(ChainOutput, onAny),
		rule(ChainPostroute, ipv4, slotIf(expr.MetaKeyOIFNAME), dnatted, fromLoopback, masq),
		rule(ChainPostroute, slotIf(expr.MetaKeyIIFNAME), slotIf(expr.MetaKeyOIFNAME), dnatted, masq),
	}
}
