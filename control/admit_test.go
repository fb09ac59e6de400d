package control_test

import (
	"strings"
	"testing"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/server"
)

// At accept, a peer the policy grants something is permitted, whatever
// the grant (leasing, reading, attaching; by uid, by primary or
// supplementary group); a peer it grants nothing, or whose credentials
// could not be read, is refused.
func TestGuardAdmit(t *testing.T) {
	p, err := control.ParsePolicy(strings.NewReader(`{"principals": [
	    {"uid": 1000, "owners": ["sandbox-*"]},
	    {"gid": 2000, "owners": ["*"], "read_only": true},
	    {"uid": 1001, "owners": ["cni/pgnet"], "attach": true},
	    {"identity": "cn:scheduler", "owners": ["*"]}
	  ]}`))
	if err != nil {
		t.Fatal(err)
	}
	g, err := control.NewGuard(p, control.GuardOptions{Service: "grpc.testing.TestService"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cred *server.PeerCred
		want server.PeerClass
	}{
		{"a uid with a rule", &server.PeerCred{UID: 1000, GID: 1000}, server.PeerPermitted},
		{"read-only by its primary group", &server.PeerCred{UID: 1500, GID: 2000}, server.PeerPermitted},
		{"read-only by a supplementary group", &server.PeerCred{UID: 1500, GID: 100, Groups: []uint32{27, 2000}}, server.PeerPermitted},
		{"attach", &server.PeerCred{UID: 1001, GID: 1001}, server.PeerPermitted},
		{"root", &server.PeerCred{}, server.PeerPermitted},
		{"no rule", &server.PeerCred{UID: 65534, GID: 65534}, server.PeerRefused},
		{"no rule, in other groups", &server.PeerCred{UID: 1, GID: 1, Groups: []uint32{27, 1000}}, server.PeerRefused},
		{"the uid of an identity rule's name", &server.PeerCred{UID: 1002, GID: 1002}, server.PeerRefused},
		{"no credentials", nil, server.PeerRefused},
	} {
		if got := g.Admit(tc.cred); got != tc.want {
			t.Errorf("%s: Admit(%+v) = %v, want %v", tc.name, tc.cred, got, tc.want)
		}
	}
	// With no rule at all, only root (which the server never asks about).
	none, err := control.NewGuard(&control.AccessPolicy{}, control.GuardOptions{Service: "grpc.testing.TestService"})
	if err != nil {
		t.Fatal(err)
	}
	if got := none.Admit(&server.PeerCred{UID: 1000, GID: 1000}); got != server.PeerRefused {
		t.Errorf("an empty policy admits uid 1000: %v", got)
	}
}
