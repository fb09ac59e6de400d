package inside

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables"
)

// span is a closed range of IPv4 addresses as integers.
type span struct{ lo, hi uint32 }

func u32(a netip.Addr) uint32 { b := a.As4(); return binary.BigEndian.Uint32(b[:]) }

func spanOf(p netip.Prefix) span {
	lo := u32(p.Masked().Addr())
	return span{lo, lo | (1<<(32-p.Bits()) - 1)}
}

// spans sorts the prefixes' ranges and merges those that overlap or
// touch: the kernel's interval sets refuse overlapping intervals, and an
// interval end and the next interval's start on the same key are better
// not left to it.
func spans(ps []netip.Prefix) []span {
	out := make([]span, 0, len(ps))
	for _, p := range ps {
		out = append(out, spanOf(p))
	}
	return merge(out)
}

// IntervalElements encodes prefixes for an interval set of IPv4 addresses
// as every table of phasegate's writes them: their ranges merged, each a
// start and an interval-end element (intervalElements).
func IntervalElements(ps []netip.Prefix) []nftables.SetElement {
	return intervalElements(spans(ps))
}

// intervalElements encodes ranges for an interval set: a start element and
// an interval-end element one past the range's last address. A range that
// ends at 255.255.255.255 has no address one past it (the + 1 wraps to 0,
// the overflow e2b-dev/infra hit with a /0-ending CIDR): it gets no end
// element, which the kernel reads as open to the end of the key space, as
// nft itself writes such a range.
func intervalElements(ss []span) []nftables.SetElement {
	els := make([]nftables.SetElement, 0, 2*len(ss))
	for _, s := range ss {
		els = append(els, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, s.lo)})
		if s.hi != ^uint32(0) {
			els = append(els, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, s.hi+1), IntervalEnd: true})
		}
	}
	return els
}
