package inside

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// MaxEntries bounds each of a policy's lists: a set of this many intervals
// is written in a few milliseconds and one netlink batch; more is refused
// rather than left to slow every slot operation down.
const MaxEntries = 4096

// MaxEntryLen is the longest text of a list's entry, "255.255.255.255/32":
// a longer one is refused before it is parsed.
const MaxEntryLen = len("255.255.255.255/32")

// ErrInvalidPolicy is wrapped by every error ParsePolicy returns.
var ErrInvalidPolicy = errors.New("invalid egress policy")

// Policy is a lease's egress policy: what the slot may send out of its
// uplink. Allow wins over Deny and over the daemon's always-denied set;
// Deny wins over the default, which is to accept. DenyAll drops everything
// but established traffic and the daemon's always-allowed set.
// RedirectTCP sends every new TCP connection not to an always-allowed
// address to the daemon's egress proxy instead.
type Policy struct {
	Allow, Deny []netip.Prefix
	DenyAll     bool
	RedirectTCP bool
}

// ParsePolicy checks a policy as a client gives it: IPv4 CIDRs (an
// address alone is its /32) without host bits, none of them /0 (use
// denyAll), no two overlapping in one list, at most MaxEntries per list.
// The lists come back sorted.
func ParsePolicy(allow, deny []string, denyAll, redirectTCP bool) (Policy, error) {
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

func parseList(name string, in []string) ([]netip.Prefix, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidPolicy, name, fmt.Sprintf(format, a...))
	}
	if len(in) > MaxEntries {
		return nil, bad("%d entries, at most %d", len(in), MaxEntries)
	}
	out := make([]netip.Prefix, 0, len(in))
	for _, s := range in {
		p, err := parseCIDR(s)
		if err != nil {
			return nil, bad("%v", err)
		}
		out = append(out, p)
	}
	slices.SortFunc(out, comparePrefix)
	for i := 1; i < len(out); i++ {
		if out[i-1].Overlaps(out[i]) {
			return nil, bad("%s and %s overlap: give each address once", out[i-1], out[i])
		}
	}
	return out, nil
}

// parseCIDR parses one IPv4 CIDR or address, refusing what the sets cannot
// mean: IPv6, host bits, /0.
func parseCIDR(s string) (netip.Prefix, error) {
	if len(s) > MaxEntryLen {
		return netip.Prefix{}, fmt.Errorf("%.40q… is not an IPv4 CIDR", s)
	}
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR (want a.b.c.d/n)", s)
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not an IPv4 address or CIDR", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	switch {
	case !p.Addr().Is4():
		return netip.Prefix{}, fmt.Errorf("%s is not IPv4: slots have IPv4 only", s)
	case p.Masked() != p:
		return netip.Prefix{}, fmt.Errorf("%s has host bits set (want %s)", s, p.Masked())
	case p.Bits() == 0:
		return netip.Prefix{}, fmt.Errorf("%s is every address: use deny_all, or leave the lists empty", s)
	}
	return p, nil
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// Strings returns the lists as CIDR strings, for records and replies.
func (p Policy) Strings() (allow, deny []string) {
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
		ss := spans(ps)
		fmt.Fprintf(h, "%s %d\n", tag, len(ss))
		for _, x := range ss {
			fmt.Fprintf(h, "%08x-%08x\n", x.lo, x.hi)
		}
	}
	list("allow", p.Allow)
	list("deny", p.Deny)
	list("always-allow", d.AlwaysAllow)
	list("always-deny", d.AlwaysDeny)
	fmt.Fprintf(h, "deny-all %t redirect %t proxy %d\n", p.DenyAll, p.RedirectTCP, d.ProxyPort)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Defaults are the daemon's part of every policy.
type Defaults struct {
	// AlwaysAllow is accepted before anything else but established
	// traffic (the orchestrator's own address, say).
	AlwaysAllow []netip.Prefix
	// AlwaysDeny is dropped unless a lease's Allow says otherwise: private
	// and link-local ranges and the host's own addresses
	// (DefaultAlwaysDeny with the host's addresses).
	AlwaysDeny []netip.Prefix
	// LinkLocal is dropped from every slot, with a policy or without,
	// unless AlwaysAllow or the policy's Allow accepts it: the link-local
	// range but the slot network, which the host's table drops after the
	// policy's own rules (package nft, whose Table.EgressDefaults fills
	// it). No rule of a policy writes it: it is part of what a policy lets
	// out (Narrow, Within), not of its fingerprint.
	LinkLocal []netip.Prefix
	// ProxyPort is the TCP port on the host, at each slot's gateway
	// address, of the egress proxy that RedirectTCP sends to; 0: none,
	// and a policy with RedirectTCP is refused.
	ProxyPort uint16
}

// DefaultAlwaysDeny are the ranges no slot reaches unless its policy
// allows them: this network, the private ranges (RFC 1918), shared address
// space (RFC 6598), loopback, link-local (the cloud metadata service),
// the IETF, documentation and benchmarking ranges, multicast and the
// reserved rest.
var DefaultAlwaysDeny = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("224.0.0.0/3"),
}

// Validate checks the defaults (IPv4 only; overlaps within a list are
// merged when written).
func (d Defaults) Validate() error {
	for _, l := range [][]netip.Prefix{d.AlwaysAllow, d.AlwaysDeny} {
		for _, p := range l {
			if !p.IsValid() || !p.Addr().Is4() || p.Masked() != p {
				return fmt.Errorf("%w: %s is not an IPv4 CIDR without host bits", ErrInvalidPolicy, p)
			}
		}
	}
	return nil
}
