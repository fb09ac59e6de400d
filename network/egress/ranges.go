package egress

import (
	"encoding/binary"
	"net/netip"
)

// Range is a closed range of IPv4 addresses as integers, Lo to Hi.
type Range struct{ Lo, Hi uint32 }

func u32(a netip.Addr) uint32 { b := a.As4(); return binary.BigEndian.Uint32(b[:]) }

func rangeOf(p netip.Prefix) Range {
	lo := u32(p.Masked().Addr())
	return Range{lo, lo | (1<<(32-p.Bits()) - 1)}
}

// Ranges sorts the prefixes' ranges and merges those that overlap or
// touch: what a set of them is written as (the kernel's interval sets
// refuse overlapping intervals, and an interval end and the next
// interval's start on the same key are better not left to it) and what
// a fingerprint hashes.
func Ranges(ps []netip.Prefix) []Range {
	out := make([]Range, 0, len(ps))
	for _, p := range ps {
		out = append(out, rangeOf(p))
	}
	return merge(out)
}
