package egress

import (
	"fmt"
	"math"
	"math/bits"
	"net/netip"
	"slices"
)

// What a policy lets a slot send is decided, for each new packet, by its
// destination and whether it is TCP, in the order of the host's rules
// (package nft's chain for the slot, then the table's rule against
// link-local destinations; the slot's own table holds the same):
//
//   - to Defaults.AlwaysAllow: it leaves (direct);
//   - with no policy: dropped to Defaults.LinkLocal, else it leaves;
//   - TCP with RedirectTCP: sent to the egress proxy (proxied), which
//     decides;
//   - with DenyAll: dropped;
//   - to Allow: it leaves; to Deny: dropped; to Defaults.AlwaysDeny or
//     Defaults.LinkLocal: dropped; else it leaves.
//
// Verdicts are ordered dropped < proxied < direct. Policy a is within
// policy b when, for every destination, TCP or not, a's verdict is at most
// b's: a narrows b. The meet of a and b gives each packet the lesser of
// their verdicts: it is within both, and every policy within both is
// within it.

// reach is what a policy lets a slot send, as sets of destinations:
// direct for every protocol but TCP; tcpDirect and tcpProxied (disjoint)
// for TCP. Every set is sorted, merged, and holds the always-allowed set's
// addresses in the direct ones.
type reach struct {
	direct, tcpDirect, tcpProxied []Range
}

// everything is the whole IPv4 space.
var everything = []Range{{0, math.MaxUint32}}

// reachOf is what p (nil: no policy) lets a slot send under defaults d.
func reachOf(p *Policy, d Defaults) reach {
	always := Ranges(d.AlwaysAllow)
	ll := Ranges(d.LinkLocal)
	if p == nil {
		r := union(always, complement(ll))
		return reach{direct: r, tcpDirect: r}
	}
	direct := always
	if !p.DenyAll {
		denied := Ranges(slices.Concat(p.Deny, d.AlwaysDeny, d.LinkLocal))
		direct = union(always, union(Ranges(p.Allow), complement(denied)))
	}
	if p.RedirectTCP {
		return reach{direct: direct, tcpDirect: always, tcpProxied: complement(always)}
	}
	return reach{direct: direct, tcpDirect: direct}
}

// within reports whether every packet a lets out, b lets out at least as
// far (a proxied packet may be direct in b, never the other way).
func (a reach) within(b reach) bool {
	return subset(a.direct, b.direct) && subset(a.tcpDirect, b.tcpDirect) &&
		subset(union(a.tcpDirect, a.tcpProxied), union(b.tcpDirect, b.tcpProxied))
}

// meet gives each packet the lesser of a's and b's verdicts.
func (a reach) meet(b reach) reach {
	tcpDirect := intersect(a.tcpDirect, b.tcpDirect)
	out := intersect(union(a.tcpDirect, a.tcpProxied), union(b.tcpDirect, b.tcpProxied))
	return reach{direct: intersect(a.direct, b.direct), tcpDirect: tcpDirect, tcpProxied: subtract(out, tcpDirect)}
}

func (a reach) equal(b reach) bool {
	return slices.Equal(a.direct, b.direct) && slices.Equal(a.tcpDirect, b.tcpDirect) && slices.Equal(a.tcpProxied, b.tcpProxied)
}

// Within reports whether p lets a slot send nothing ceiling does not, under
// defaults d (nil: no policy).
func Within(p, ceiling *Policy, d Defaults) bool {
	return reachOf(p, d).within(reachOf(ceiling, d))
}

// Narrow returns the policy of a slot whose ceiling is ceiling (its
// network's policy) and for which p was asked (a container's own), under
// defaults d; nil is no policy. It is p when p asks for nothing beyond the
// ceiling, the ceiling when p asks for none (nil) or for all the ceiling
// lets out and more, and otherwise the policy that lets out exactly what
// both let out: its lists are computed from the two policies' sets, never
// widened nor narrowed further.
//
// Some such sets are no policy: TCP sent to the egress proxy for some
// destinations and straight out or dropped for others (a ceiling with
// RedirectTCP and a p without it that drops some address), or lists longer
// than MaxEntries. Those are refused, with an error wrapping
// ErrInvalid, rather than approximated.
func Narrow(ceiling, p *Policy, d Defaults) (*Policy, error) {
	if p == nil {
		return ceiling, nil
	}
	if has6(ceiling) || has6(p) {
		// The sets below are IPv4's: a meet computed from them would
		// drop the IPv6 CIDRs of one side, and let out over IPv6 what
		// it denies.
		return nil, fmt.Errorf("%w: IPv6 CIDRs are not narrowed yet: give them in the network's policy, with no container policy", ErrInvalid)
	}
	rc, rp := reachOf(ceiling, d), reachOf(p, d)
	switch {
	case rp.within(rc):
		return p, nil
	case rc.within(rp):
		return ceiling, nil
	}
	m := rc.meet(rp)
	out, err := policyOf(m, d)
	if err != nil {
		return nil, err
	}
	if got := reachOf(out, d); !got.equal(m) {
		// policyOf is exact by construction; a slip is refused, never
		// written.
		return nil, fmt.Errorf("%w: the policy computed within the network's does not let out what both do", ErrInvalid)
	}
	return out, nil
}

// policyOf writes reach r as a policy under defaults d: the direct set
// outside the always-allowed one as lists (what it holds of the
// always-denied and link-local sets allowed, what it leaves of the rest
// denied), or DenyAll when it holds nothing there; TCP either as the
// rest, or all of it (but the always-allowed set) to the proxy.
func policyOf(r reach, d Defaults) (*Policy, error) {
	always := Ranges(d.AlwaysAllow)
	p := &Policy{}
	switch {
	case slices.Equal(r.tcpDirect, r.direct) && len(r.tcpProxied) == 0:
	case slices.Equal(r.tcpDirect, always) && slices.Equal(r.tcpProxied, complement(always)):
		p.RedirectTCP = true
	default:
		return nil, fmt.Errorf("%w: within the network's policy, TCP would go to the egress proxy for some addresses and straight out or nowhere for others, which no policy says: ask for redirect_tcp as the network does, or for no address it drops", ErrInvalid)
	}
	if len(subtract(r.direct, always)) == 0 {
		p.DenyAll = true
		return p, nil
	}
	denied := Ranges(slices.Concat(d.AlwaysDeny, d.LinkLocal))
	p.Allow = prefixesOf(subtract(intersect(r.direct, denied), always))
	p.Deny = prefixesOf(subtract(complement(r.direct), denied))
	for _, l := range []struct {
		name string
		list []netip.Prefix
	}{{"allow", p.Allow}, {"deny", p.Deny}} {
		if len(l.list) > MaxEntries {
			return nil, fmt.Errorf("%w: within the network's policy, the %s list would need %d ranges, at most %d", ErrInvalid, l.name, len(l.list), MaxEntries)
		}
		if slices.ContainsFunc(l.list, func(x netip.Prefix) bool { return x.Bits() == 0 }) {
			return nil, fmt.Errorf("%w: within the network's policy, the %s list would be every address", ErrInvalid, l.name)
		}
	}
	return p, nil
}

// Without returns the ranges of p that cut does not cover, as prefixes.
func Without(p netip.Prefix, cut ...netip.Prefix) []netip.Prefix {
	return prefixesOf(subtract(Ranges([]netip.Prefix{p}), Ranges(cut)))
}

// Set algebra over sorted, merged ranges (Ranges' form: disjoint, none
// touching the next).

// merge sorts ss and merges the ranges that overlap or touch.
func merge(ss []Range) []Range {
	slices.SortFunc(ss, func(a, b Range) int {
		switch {
		case a.Lo < b.Lo:
			return -1
		case a.Lo > b.Lo:
			return 1
		}
		return 0
	})
	merged := ss[:0]
	for _, s := range ss {
		if n := len(merged); n > 0 && (merged[n-1].Hi == math.MaxUint32 || s.Lo <= merged[n-1].Hi+1) {
			merged[n-1].Hi = max(merged[n-1].Hi, s.Hi)
			continue
		}
		merged = append(merged, s)
	}
	return merged
}

func union(a, b []Range) []Range { return merge(slices.Concat(a, b)) }

func complement(a []Range) []Range {
	var out []Range
	next := uint64(0)
	for _, s := range a {
		if uint64(s.Lo) > next {
			out = append(out, Range{uint32(next), s.Lo - 1})
		}
		next = uint64(s.Hi) + 1
	}
	if next <= math.MaxUint32 {
		out = append(out, Range{uint32(next), math.MaxUint32})
	}
	return out
}

func intersect(a, b []Range) []Range {
	var out []Range
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := max(a[i].Lo, b[j].Lo), min(a[i].Hi, b[j].Hi)
		if lo <= hi {
			out = append(out, Range{lo, hi})
		}
		if a[i].Hi < b[j].Hi {
			i++
		} else {
			j++
		}
	}
	return out
}

func subtract(a, b []Range) []Range { return intersect(a, complement(b)) }

func subset(a, b []Range) bool { return slices.Equal(intersect(a, b), a) }

// prefixesOf writes ranges as the fewest prefixes that cover them exactly.
func prefixesOf(ss []Range) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		for lo, hi := uint64(s.Lo), uint64(s.Hi); lo <= hi; {
			// The largest block aligned at lo that ends by hi.
			size := uint64(1) << 32
			if lo != 0 {
				size = lo & -lo
			}
			for size > hi-lo+1 {
				size >>= 1
			}
			a := netip.AddrFrom4([4]byte{byte(lo >> 24), byte(lo >> 16), byte(lo >> 8), byte(lo)})
			out = append(out, netip.PrefixFrom(a, 32-(bits.Len64(size)-1)))
			lo += size
		}
	}
	return out
}

// has6 reports whether p (nil: none) has an IPv6 CIDR.
func has6(p *Policy) bool {
	return p != nil && slices.ContainsFunc(slices.Concat(p.Allow, p.Deny), is6)
}
