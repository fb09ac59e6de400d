package egress

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/phasegate/phasegate/network"
)

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
	// and a policy with RedirectTCP is refused (Admit).
	ProxyPort uint16
	// IPv6 says the slots are dual-stack (an IPv6 slot range is set):
	// without it a policy with an IPv6 CIDR is refused (Admit), since
	// no slot could send to it.
	IPv6 bool
}

// DefaultAlwaysDeny are the ranges no slot reaches unless its policy
// allows them: this network, the private ranges (RFC 1918), shared address
// space (RFC 6598), loopback, link-local (the cloud metadata service),
// the IETF, documentation and benchmarking ranges, multicast and the
// reserved rest, and their IPv6 twins (RFC 6890's registry).
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
	// The IPv6 twins, for dual-stack slots: unspecified and loopback,
	// IPv4-mapped, NAT64's local use, discard, IETF protocol
	// assignments, documentation, unique local (IPv6's private ranges),
	// link-local and multicast.
	netip.MustParsePrefix("::/127"),
	netip.MustParsePrefix("::ffff:0:0/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("2001::/23"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
}

// Validate checks the defaults: CIDRs without host bits, IPv4 or IPv6 in
// AlwaysDeny, IPv4 in AlwaysAllow (the table's always-allowed set is
// IPv4's: an IPv6 range is always allowed by no rule yet). Overlaps
// within a list are merged when written.
func (d Defaults) Validate() error {
	for k, l := range [][]netip.Prefix{d.AlwaysAllow, d.AlwaysDeny} {
		for _, p := range l {
			if !p.IsValid() || p.Masked() != p || (k == 0 && !p.Addr().Is4()) {
				return fmt.Errorf("%w: %s is not an IPv4 CIDR without host bits%s", ErrInvalid, p,
					map[bool]string{true: "", false: " (nor, in the always-denied set, an IPv6 one)"}[k == 0])
			}
		}
	}
	return nil
}

// Admit refuses a policy that d cannot write: RedirectTCP without an
// egress proxy, an IPv6 CIDR without IPv6 slots. Every writer of a policy asks (the daemon before it takes
// a request, the host's table and the slot's own before they write), so a
// policy is refused the same wherever it comes from. The error wraps
// ErrInvalid and a *network.SettingError naming ProxyPort.
func (d Defaults) Admit(p Policy) error {
	if p.RedirectTCP && d.ProxyPort == 0 {
		return fmt.Errorf("%w: redirect_tcp: the daemon has no egress proxy: %w", ErrInvalid,
			&network.SettingError{Setting: "ProxyPort", Problem: "is not set"})
	}
	if i := slices.IndexFunc(slices.Concat(p.Allow, p.Deny), is6); i >= 0 && !d.IPv6 {
		return fmt.Errorf("%w: %s is IPv6 and the slots have IPv4 only: %w", ErrInvalid, slices.Concat(p.Allow, p.Deny)[i],
			&network.SettingError{Setting: "CIDR6", Problem: "is not set"})
	}
	return nil
}
