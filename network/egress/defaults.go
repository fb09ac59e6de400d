package egress

import (
	"fmt"
	"net/netip"

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
				return fmt.Errorf("%w: %s is not an IPv4 CIDR without host bits", ErrInvalid, p)
			}
		}
	}
	return nil
}

// Admit refuses a policy that d cannot write: RedirectTCP without an
// egress proxy. Every writer of a policy asks (the daemon before it takes
// a request, the host's table and the slot's own before they write), so a
// policy is refused the same wherever it comes from. The error wraps
// ErrInvalid and a *network.SettingError naming ProxyPort.
func (d Defaults) Admit(p Policy) error {
	if p.RedirectTCP && d.ProxyPort == 0 {
		return fmt.Errorf("%w: redirect_tcp: the daemon has no egress proxy: %w", ErrInvalid,
			&network.SettingError{Setting: "ProxyPort", Problem: "is not set"})
	}
	return nil
}
