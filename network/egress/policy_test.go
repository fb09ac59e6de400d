package egress_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/egress"
)

func TestParse(t *testing.T) {
	many := make([]string, egress.MaxEntries+1)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)
	}
	for _, tc := range []struct {
		name        string
		allow, deny []string
		want        string // "" for accepted; else part of the error
	}{
		{"empty", nil, nil, ""},
		{"an address is its /32", []string{"1.1.1.1"}, nil, ""},
		{"CIDRs", []string{"8.8.8.0/24", "1.1.1.1/32"}, []string{"10.0.0.0/8"}, ""},
		{"allow and deny may overlap", []string{"10.1.0.0/16"}, []string{"10.0.0.0/8"}, ""},
		{"ending at the top of the space", nil, []string{"240.0.0.0/4"}, ""},
		{"malformed", []string{"1.2.3"}, nil, "not an address or CIDR"},
		{"malformed prefix", []string{"1.2.3.4/33"}, nil, "not a CIDR"},
		{"host bits", nil, []string{"10.0.0.1/8"}, "host bits set (want 10.0.0.0/8)"},
		{"/0", nil, []string{"0.0.0.0/0"}, "every address: use deny_all"},
		{"IPv6 (dual-stack slots)", []string{"2001:db8::/32", "1.1.1.1"}, []string{"fd00::/8", "2001:db8:1::1"}, ""},
		{"IPv6 host bits", []string{"2001:db8::1/32"}, nil, "host bits set (want 2001:db8::/32)"},
		{"IPv6 ::/0", nil, []string{"::/0"}, "every address: use deny_all"},
		{"IPv6 overlap", nil, []string{"fd00::/8", "fd00:1::/32"}, "overlap"},
		{"malformed IPv6", []string{"fd00:::1/64"}, nil, "not a CIDR"},
		{"IPv4-mapped IPv6", []string{"::ffff:1.2.3.4"}, nil, "IPv4-mapped"},
		{"overlap in one list", []string{"10.0.0.0/8", "10.2.0.0/16"}, nil, "overlap"},
		{"duplicate", nil, []string{"1.1.1.1", "1.1.1.1/32"}, "overlap"},
		{"too many", many, nil, fmt.Sprintf("at most %d", egress.MaxEntries)},
		{"absurdly long entry", []string{strings.Repeat("1", 1<<20)}, nil, "is not a CIDR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := egress.Parse(tc.allow, tc.deny, false, false)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "":
				if len(p.Allow) != len(tc.allow) || len(p.Deny) != len(tc.deny) {
					t.Errorf("parsed %v, %v from %v, %v", p.Allow, p.Deny, tc.allow, tc.deny)
				}
			case err == nil:
				t.Fatalf("accepted: %+v", p)
			case !errors.Is(err, egress.ErrInvalid) || !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %q, want ErrInvalid saying %q", err, tc.want)
			case len(err.Error()) > 200:
				t.Errorf("error of %d bytes: hostile input must not be echoed whole", len(err.Error()))
			}
		})
	}
}

func ExampleParse() {
	p, err := egress.Parse([]string{"8.8.8.8", "1.1.1.0/24"}, []string{"203.0.113.0/24"}, false, false)
	if err != nil {
		panic(err)
	}
	allow, deny := p.Lists()
	fmt.Println(allow, deny)
	_, err = egress.Parse([]string{"0.0.0.0/0"}, nil, false, false)
	fmt.Println(err)
	// Output:
	// [1.1.1.0/24 8.8.8.8/32] [203.0.113.0/24]
	// invalid egress policy: allow: 0.0.0.0/0 is every address: use deny_all, or leave the lists empty
}

// A policy written as the Slots API's message and read back is the same
// policy, every field of it: what a lease's record and a reply carry.
func TestMessageRoundTrip(t *testing.T) {
	for _, p := range []egress.Policy{
		{},
		{DenyAll: true},
		{RedirectTCP: true},
		{Allow: []netip.Prefix{netip.MustParsePrefix("1.1.1.0/24"), netip.MustParsePrefix("8.8.8.8/32")},
			Deny: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, DenyAll: true, RedirectTCP: true},
	} {
		m := egress.ToMessage[phasegatev1.EgressPolicy](&p)
		got, err := egress.FromMessage(m)
		if err != nil || got == nil || !slices.Equal(got.Allow, p.Allow) || !slices.Equal(got.Deny, p.Deny) ||
			got.DenyAll != p.DenyAll || got.RedirectTCP != p.RedirectTCP {
			t.Errorf("%+v as %v read back as %+v, %v", p, m, got, err)
		}
	}
	if m := egress.ToMessage[phasegatev1.EgressPolicy](nil); m != nil {
		t.Errorf("no policy written as %v", m)
	}
	if got, err := egress.FromMessage((*phasegatev1.EgressPolicy)(nil)); got != nil || err != nil {
		t.Errorf("no message read as %+v, %v", got, err)
	}
}
