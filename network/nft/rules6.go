package nft

import (
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// ICMPv6 types the IPv6 rules match (RFC 4443, RFC 4861).
const (
	icmp6EchoRequest   = 128
	icmp6RouterAdvert  = 134
	icmp6NeighSolicit  = 135
	icmp6NeighAdvert   = 136
	icmp6Redirect      = 137
	ndpHopLimit        = 255 // what a receiver of NDP insists on
	ip6HopLimitOffset  = 7
	ip6DaddrOffset     = 24
	rtnLocal, rtnMulti = unix.RTN_LOCAL, unix.RTN_MULTICAST
)

// fixed6 are the table's IPv6 rules, by where they go among the fixed
// rules (rules).
type fixed6 struct{ egressFirst, egressLast, input []*nftables.Rule }

// rules6 returns the IPv6 rules of the table, written whether or not the
// slots have IPv6 (a host end without IPv6 takes no IPv6 packet, so they
// then match nothing but the last, which drops every IPv6 packet):
//   - chain egress, after established traffic: a router advertisement or
//     a redirect from a slot is dropped and counted (the host ends ignore
//     them too: accept_ra and accept_redirects 0); neighbour discovery
//     with the slot's own gateway (a solicitation or advertisement, hop
//     limit 255, to an address of the host end or a multicast one) is
//     accepted before the lease's policy, as ARP is, which nftables' inet
//     family never sees: under DenyAll the host must still find the
//     slot's address;
//   - chain egress, last: IPv6 to a link-local destination (fe80::/10) is
//     dropped and counted, as IPv4's is (linkLocal6); the lease's egress
//     policy, between the two (the egress map), has IPv6 rules of its
//     own (egressRules: its IPv6 CIDRs and the always-denied set's IPv6
//     ranges, SetAlwaysDeny6);
//   - chain input: neighbour discovery as above, and an echo request to
//     the slot's own gateway, as IPv4's.
//
// The antispoof chain needs nothing of its own: its reverse-path test is
// the FIB's of the packet's family, and a slot's /127 is routed through
// its host end alone. Slot-to-slot, inbound and the host's other
// addresses are the family-blind rules of chains forward and input.
func (t *Table) rules6(iifSlot []expr.Any, rule func(chain, comment string, parts ...[]expr.Any) *nftables.Rule) fixed6 {
	v := func(e ...expr.Any) []expr.Any { return e }
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	drop := &expr.Verdict{Kind: expr.VerdictDrop}
	icmp6Type := func(typ byte) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{typ}},
		}
	}
	ndp := slices.Concat(ipv6(),
		v(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{icmp6NeighSolicit}, ToData: []byte{icmp6NeighAdvert}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ip6HopLimitOffset, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{ndpHopLimit}},
			&expr.Fib{Register: 1, FlagDADDR: true, FlagIIF: true, ResultADDRTYPE: true},
			&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: binaryutil.NativeEndian.PutUint32(rtnLocal), ToData: binaryutil.NativeEndian.PutUint32(rtnMulti)},
		))
	return fixed6{
		egressFirst: []*nftables.Rule{
			rule(ChainEgress, commentRouter6, iifSlot, ipv6(), icmp6Type(icmp6RouterAdvert), v(&expr.Counter{}, drop)),
			rule(ChainEgress, commentRouter6, iifSlot, ipv6(), icmp6Type(icmp6Redirect), v(&expr.Counter{}, drop)),
			rule(ChainEgress, "", iifSlot, ndp, v(accept)),
		},
		egressLast: []*nftables.Rule{t.linkLocal6(iifSlot, rule)},
		input: []*nftables.Rule{
			rule(ChainInput, "", iifSlot, ndp, v(accept)),
			rule(ChainInput, "", iifSlot, ipv6(), icmp6Type(icmp6EchoRequest), ownGateway(), v(accept)),
		},
	}
}

// ipv6 matches IPv6 packets.
func ipv6() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV6}}}
}

// linkLocal6 is chain egress's last rule: a slot's IPv6 to fe80::/10
// dropped and counted (as link-local) whatever its policy, unless
// forwarded by a rule before it (a policy's Allow); for a table whose
// slots have no IPv6 (no WithSlotNetwork6), whose host ends take none,
// every IPv6 packet, uncounted.
func (t *Table) linkLocal6(iifSlot []expr.Any, rule func(chain, comment string, parts ...[]expr.Any) *nftables.Rule) *nftables.Rule {
	drop := &expr.Verdict{Kind: expr.VerdictDrop}
	if !t.slotNet6.IsValid() {
		return rule(ChainEgress, "", iifSlot, ipv6(), []expr.Any{drop})
	}
	return rule(ChainEgress, commentLinkLocal, iifSlot, daddrInPrefix6(linkLocal6), []expr.Any{&expr.Counter{}, drop})
}

// linkLocal6 is IPv6's link-local range.
var linkLocal6 = netip.MustParsePrefix("fe80::/10")

// daddrInPrefix6 matches an IPv6 destination in p.
func daddrInPrefix6(p netip.Prefix) []expr.Any {
	var mask [16]byte
	for b := range p.Bits() {
		mask[b/8] |= 0x80 >> (b % 8)
	}
	net := p.Masked().Addr().As16()
	return append(ipv6(),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ip6DaddrOffset, Len: 16},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 16, Mask: mask[:], Xor: make([]byte, 16)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net[:]},
	)
}

// daddrIn6 matches an IPv6 destination in set.
func daddrIn6(set *nftables.Set) []expr.Any {
	return append(ipv6(),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ip6DaddrOffset, Len: 16},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	)
}
