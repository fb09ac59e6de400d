package egress

import (
	"encoding/binary"
	"net/netip"
	"slices"
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
//
// They are the IPv4 prefixes' only: the IPv6 ones are Prefixes6's.
func Ranges(ps []netip.Prefix) []Range {
	out := make([]Range, 0, len(ps))
	for _, p := range ps {
		if p.Addr().Is4() {
			out = append(out, rangeOf(p))
		}
	}
	return merge(out)
}

// is6 reports whether p is an IPv6 prefix.
func is6(p netip.Prefix) bool { return p.Addr().Is6() }

// Prefixes6 returns the IPv6 prefixes of ps, sorted, without those inside
// another: what an IPv6 set of them is written as (the kernel's interval
// sets refuse overlapping intervals) and what a fingerprint hashes.
func Prefixes6(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if is6(p) {
			out = append(out, p.Masked())
		}
	}
	slices.SortFunc(out, comparePrefix)
	return slices.CompactFunc(out, func(a, b netip.Prefix) bool { return a.Overlaps(b) })
}
