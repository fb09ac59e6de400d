package cniapi

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/phases/lease"
)

// ADD's egress policy is the network's, narrowed by the container's own
// (egress.Narrow, where the rule and its exhaustive tests live): the
// issue's attack (a deny-all network, a container allowing 0.0.0.0/1 and
// 128.0.0.0/1) is deny-all; a container's policy within the network's is
// taken as given; a bad one is refused naming it as the container's; and
// a large one costs the caller's rate though the answer is small.
func TestCNIAddNarrowsTheContainersEgress(t *testing.T) {
	d := egress.Defaults{AlwaysDeny: egress.DefaultAlwaysDeny, LinkLocal: []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16")}}
	everything := &cniv1.Egress{Allow: []string{"0.0.0.0/1", "128.0.0.0/1"}}
	var many []string
	for i := range egress.MaxEntries {
		many = append(many, fmt.Sprintf("11.%d.%d.1/32", i/128, 2*(i%128)))
	}
	for _, tc := range []struct {
		what               string
		network, container *cniv1.Egress
		want               string // the policy's lists and flags; "none"
		cost               int
		err                string
	}{
		{"a deny-all network", &cniv1.Egress{DenyAll: true}, everything, "[] [] true", 0, ""},
		{"the always-denied set", &cniv1.Egress{}, everything, "[] [] false", 0, ""},
		{"no network policy, none asked", nil, nil, "none", 0, ""},
		{"no network policy, the metadata service asked for", nil, &cniv1.Egress{Allow: []string{"169.254.169.254/32"}}, "[] [] false", 0, ""},
		{"within the network's", &cniv1.Egress{Allow: []string{"192.0.2.0/24"}}, &cniv1.Egress{Allow: []string{"192.0.2.0/25"}}, "[192.0.2.0/25] [] false", 0, ""},
		{"partly beyond", &cniv1.Egress{Allow: []string{"192.0.2.0/24"}}, &cniv1.Egress{Allow: []string{"192.0.2.0/25", "10.0.0.0/8"}}, "[192.0.2.0/25] [] false", 0, ""},
		{"a large container's policy within a deny-all network", &cniv1.Egress{DenyAll: true}, &cniv1.Egress{Deny: many}, "[] [] true", egress.MaxEntries / lease.EgressEntriesPerCall, ""},
		{"a bad container's policy", nil, &cniv1.Egress{Allow: []string{"10.0.0.1/8"}}, "", 0, "the container's invalid egress policy: allow: 10.0.0.1/8 has host bits set"},
	} {
		pol, cost, err := egressOf(cniv1.AddRequest{Egress: tc.network, ContainerEgress: tc.container}, d)
		if tc.err != "" {
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want InvalidArgument saying %q", tc.what, err, tc.err)
			}
			continue
		}
		got := "none"
		if pol != nil {
			allow, deny := pol.Lists()
			got = fmt.Sprintf("%v %v %t", allow, deny, pol.DenyAll)
		}
		if err != nil || got != tc.want || cost != tc.cost {
			t.Errorf("%s: %s cost %d, %v; want %s cost %d", tc.what, got, cost, err, tc.want, tc.cost)
		}
	}
}
