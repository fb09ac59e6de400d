package nftexpr

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables"

	"github.com/phasegate/phasegate/network/egress"
)

// IntervalElements encodes prefixes for an interval set of IPv4 addresses
// as every table of phasegate's writes them: their ranges merged
// (egress.Ranges), each a start and an interval-end element
// (intervalElements).
func IntervalElements(ps []netip.Prefix) []nftables.SetElement {
	return intervalElements(egress.Ranges(ps))
}

// intervalElements encodes ranges for an interval set: a start element and
// an interval-end element one past the range's last address. A range that
// ends at 255.255.255.255 has no address one past it (the + 1 wraps to 0,
// the overflow e2b-dev/infra hit with a /0-ending CIDR): it gets no end
// element, which the kernel reads as open to the end of the key space, as
// nft itself writes such a range.
func intervalElements(rs []egress.Range) []nftables.SetElement {
	els := make([]nftables.SetElement, 0, 2*len(rs))
	for _, r := range rs {
		els = append(els, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, r.Lo)})
		if r.Hi != ^uint32(0) {
			els = append(els, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, r.Hi+1), IntervalEnd: true})
		}
	}
	return els
}

// IntervalElements6 encodes the IPv6 prefixes of ps for an interval set
// of IPv6 addresses, as IntervalElements does IPv4's: those inside another
// dropped (egress.Prefixes6), each a start and an interval-end element one
// past its last address (none for a prefix that ends the space).
func IntervalElements6(ps []netip.Prefix) []nftables.SetElement {
	var els []nftables.SetElement
	for _, p := range egress.Prefixes6(ps) {
		lo := p.Addr().As16()
		els = append(els, nftables.SetElement{Key: lo[:]})
		hi := lo
		for b := p.Bits(); b < 128; b++ {
			hi[b/8] |= 0x80 >> (b % 8)
		}
		if end := netip.AddrFrom16(hi).Next(); end.IsValid() {
			k := end.As16()
			els = append(els, nftables.SetElement{Key: k[:], IntervalEnd: true})
		}
	}
	return els
}
