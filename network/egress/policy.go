package egress

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// MaxEntries bounds each of a policy's lists: a set of this many intervals
// is written in a few milliseconds and one netlink batch; more is refused
// rather than left to slow every slot operation down.
const MaxEntries = 4096

// MaxEntryLen is the longest text of a list's entry, an IPv6 CIDR
// written in full: a longer one is refused before it is parsed.
const MaxEntryLen = len("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128")

// ErrInvalid is wrapped by every error that refuses a policy.
var ErrInvalid = errors.New("invalid egress policy")

// Policy is a lease's egress policy: what the slot may send out of its
// uplink. Allow wins over Deny and over the daemon's always-denied set;
// Deny wins over the default, which is to accept. DenyAll drops everything
// but established traffic and the daemon's always-allowed set.
// RedirectTCP sends every new TCP connection not to an always-allowed
// address to the daemon's egress proxy instead.
//
// The lists are canonical (Validate): IPv4 and IPv6 prefixes (IPv6 for
// dual-stack slots) without host bits, sorted (IPv4 first), none /0, none
// overlapping another of its list.
type Policy struct {
	Allow, Deny []netip.Prefix
	DenyAll     bool
	RedirectTCP bool
}

// Parse checks a policy as a client gives it: IPv4 or IPv6 CIDRs (an
// address alone is its /32 or /128) without host bits, none of them /0 (use denyAll), no two
// overlapping in one list, at most MaxEntries per list. The lists come
// back sorted.
func Parse(allow, deny []string, denyAll, redirectTCP bool) (Policy, error) {
	a, err := parseList("allow", allow)
	if err != nil {
		return Policy{}, err
	}
	d, err := parseList("deny", deny)
	if err != nil {
		return Policy{}, err
	}
	return Policy{Allow: a, Deny: d, DenyAll: denyAll, RedirectTCP: redirectTCP}, nil
}

// Message is a policy's protobuf form: the Slots API's EgressPolicy and a
// lease record's have these four fields, and so has the CNI plugin's wire
// policy. Its getters answer the zero values on a nil message.
type Message interface {
	GetAllow() []string
	GetDeny() []string
	GetDenyAll() bool
	GetRedirectTcp() bool
}

// FromMessage parses m (Parse); a nil m is no policy (nil).
func FromMessage[M interface {
	*T
	Message
}, T any](m M) (*Policy, error) {
	if m == nil {
		return nil, nil
	}
	p, err := Parse(m.GetAllow(), m.GetDeny(), m.GetDenyAll(), m.GetRedirectTcp())
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// ToMessage writes p (nil: none) as a new message of type T: the Slots
// API's EgressPolicy or a lease record's, whose fields it sets by their
// protobuf names, so that a field added to the policy is written to both
// here.
func ToMessage[T any, M interface {
	*T
	Message
	ProtoReflect() protoreflect.Message
}](p *Policy) M {
	if p == nil {
		return nil
	}
	m := M(new(T))
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	allow, deny := p.Lists()
	for _, l := range []struct {
		name protoreflect.Name
		list []string
	}{{"allow", allow}, {"deny", deny}} {
		if len(l.list) == 0 {
			continue
		}
		out := r.Mutable(fields.ByName(l.name)).List()
		for _, s := range l.list {
			out.Append(protoreflect.ValueOfString(s))
		}
	}
	r.Set(fields.ByName("deny_all"), protoreflect.ValueOfBool(p.DenyAll))
	r.Set(fields.ByName("redirect_tcp"), protoreflect.ValueOfBool(p.RedirectTCP))
	return m
}

// Validate checks that p is as Parse returns it: what a policy made by
// other means (a record read back, Narrow) must be before it is written.
func (p Policy) Validate() error {
	for _, l := range []struct {
		name string
		list []netip.Prefix
	}{{"allow", p.Allow}, {"deny", p.Deny}} {
		if err := checkList(l.name, l.list); err != nil {
			return err
		}
	}
	return nil
}

func parseList(name string, in []string) ([]netip.Prefix, error) {
	if len(in) > MaxEntries {
		return nil, listError(name, "%d entries, at most %d", len(in), MaxEntries)
	}
	out := make([]netip.Prefix, 0, len(in))
	for _, s := range in {
		p, err := parseCIDR(s)
		if err != nil {
			return nil, listError(name, "%v", err)
		}
		out = append(out, p)
	}
	slices.SortFunc(out, comparePrefix)
	if err := checkList(name, out); err != nil {
		return nil, err
	}
	return out, nil
}

// checkList checks a list's length, each prefix (checkPrefix), and that
// they are sorted and no two overlap.
func checkList(name string, ps []netip.Prefix) error {
	if len(ps) > MaxEntries {
		return listError(name, "%d entries, at most %d", len(ps), MaxEntries)
	}
	for i, p := range ps {
		if err := checkPrefix(p, p.String()); err != nil {
			return listError(name, "%v", err)
		}
		if i == 0 {
			continue
		}
		if ps[i-1].Overlaps(p) {
			return listError(name, "%s and %s overlap: give each address once", ps[i-1], p)
		}
		if comparePrefix(ps[i-1], p) > 0 {
			return listError(name, "%s comes after %s: the list is not sorted", ps[i-1], p)
		}
	}
	return nil
}

func listError(name, format string, a ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, name, fmt.Sprintf(format, a...))
}

// parseCIDR parses one IPv4 or IPv6 CIDR or address, refusing what the
// sets cannot mean: an IPv4-mapped IPv6 address, host bits, /0.
func parseCIDR(s string) (netip.Prefix, error) {
	if len(s) > MaxEntryLen {
		return netip.Prefix{}, fmt.Errorf("%.40q… is not a CIDR", s)
	}
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR (want a.b.c.d/n or an IPv6 prefix)", s)
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not an address or CIDR", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	return p, checkPrefix(p, s)
}

// checkPrefix refuses a prefix the sets cannot mean; s is how it was
// written.
func checkPrefix(p netip.Prefix, s string) error {
	switch {
	case !p.IsValid():
		return fmt.Errorf("%s is not a CIDR", s)
	case p.Addr().Is4In6():
		return fmt.Errorf("%s is an IPv4-mapped IPv6 address: write it as IPv4", s)
	case p.Masked() != p:
		return fmt.Errorf("%s has host bits set (want %s)", s, p.Masked())
	case p.Bits() == 0:
		return fmt.Errorf("%s is every address: use deny_all, or leave the lists empty", s)
	}
	return nil
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// Lists returns the lists as CIDR strings, for records and replies (nil
// for an empty list): what a Message holds.
func (p Policy) Lists() (allow, deny []string) {
	str := func(ps []netip.Prefix) []string {
		if len(ps) == 0 {
			return nil
		}
		s := make([]string, len(ps))
		for i, x := range ps {
			s[i] = x.String()
		}
		return s
	}
	return str(p.Allow), str(p.Deny)
}

// Fingerprint identifies the rules p is written as with defaults d:
// equal fingerprints, equal rules. It hashes the sets as written (merged
// ranges), so defaults that differ only inside a range they already cover
// (a host address in 10.0.0.0/8) give the same fingerprint.
func (p Policy) Fingerprint(d Defaults) string {
	h := sha256.New()
	list := func(tag string, ps []netip.Prefix) {
		rs := Ranges(ps)
		fmt.Fprintf(h, "%s %d\n", tag, len(rs))
		for _, x := range rs {
			fmt.Fprintf(h, "%08x-%08x\n", x.Lo, x.Hi)
		}
	}
	list6 := func(tag string, ps []netip.Prefix) {
		fmt.Fprintf(h, "%s6 %v\n", tag, Prefixes6(ps))
	}
	list("allow", p.Allow)
	list("deny", p.Deny)
	list("always-allow", d.AlwaysAllow)
	list("always-deny", d.AlwaysDeny)
	if slices.ContainsFunc(slices.Concat(p.Allow, p.Deny), is6) {
		// Only then: a policy without IPv6 keeps the fingerprint an
		// earlier build recorded. (Its chain's rule against the
		// always-denied set's IPv6 ranges looks them up in the table's
		// set, as the IPv4 rule does; a slot restored from a build
		// without IPv6 has none.)
		list6("allow", p.Allow)
		list6("deny", p.Deny)
		list6("always-deny", d.AlwaysDeny)
	}
	fmt.Fprintf(h, "deny-all %t redirect %t proxy %d\n", p.DenyAll, p.RedirectTCP, d.ProxyPort)
	return hex.EncodeToString(h.Sum(nil)[:16])
}
