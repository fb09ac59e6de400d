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
