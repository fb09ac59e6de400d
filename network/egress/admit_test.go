package egress_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/phasegate/phasegate/network"
	"github.com/phasegate/phasegate/network/egress"
)

// A policy with an IPv6 CIDR is refused unless the slots are dual-stack,
// naming the setting that would make them so; IPv4 alone is admitted
// either way.
func TestAdmitIPv6(t *testing.T) {
	v4 := egress.Policy{Allow: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
	v6 := egress.Policy{Deny: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}}
	for _, tc := range []struct {
		name    string
		dual    bool
		p       egress.Policy
		refused bool
	}{
		{"IPv4 on IPv4 slots", false, v4, false},
		{"IPv6 on IPv4 slots", false, v6, true},
		{"IPv4 on dual-stack slots", true, v4, false},
		{"IPv6 on dual-stack slots", true, v6, false},
	} {
		err := egress.Defaults{IPv6: tc.dual}.Admit(tc.p)
		var se *network.SettingError
		switch {
		case !tc.refused && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.refused && (!errors.Is(err, egress.ErrInvalid) || !errors.As(err, &se) || se.Setting != "CIDR6"):
			t.Errorf("%s: Admit = %v, want ErrInvalid naming CIDR6", tc.name, err)
		}
	}
}

// Narrow, whose sets are IPv4's, refuses to meet two policies when either
// has an IPv6 CIDR rather than drop one side's; a network's policy alone
// passes as it is.
func TestNarrowRefusesIPv6(t *testing.T) {
	d := egress.Defaults{AlwaysDeny: egress.DefaultAlwaysDeny, IPv6: true}
	v4 := &egress.Policy{Deny: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
	v6 := &egress.Policy{Deny: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}}
	for _, tc := range []struct {
		name           string
		ceiling, asked *egress.Policy
		refused        bool
	}{
		{"an IPv6 network policy alone", v6, nil, false},
		{"an IPv6 network policy and an IPv4 container's", v6, v4, true},
		{"an IPv4 network policy and an IPv6 container's", v4, v6, true},
	} {
		got, err := egress.Narrow(tc.ceiling, tc.asked, d)
		switch {
		case tc.refused && !errors.Is(err, egress.ErrInvalid):
			t.Errorf("%s: Narrow = %v, %v; want ErrInvalid", tc.name, got, err)
		case !tc.refused && (err != nil || got != tc.ceiling):
			t.Errorf("%s: Narrow = %v, %v; want the network's policy", tc.name, got, err)
		}
	}
}
