package lease

import (
	"strings"
	"testing"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/leases"
)

// Who may change a lease: its principal, or one the policy lets act for
// its owner; a CNI attachment, whose lease id the runtime never sees and
// Get shows to exactly these, is its principal's and root's: neither
// leasing its owner nor attach for its network is enough.
func TestMayAct(t *testing.T) {
	p, err := control.ParsePolicy(strings.NewReader(`{"principals": [
	    {"uid": 1000, "owners": ["cni/*", "sandbox-*"]},
	    {"uid": 1001, "owners": ["cni/pgnet"], "attach": true},
	    {"uid": 1002, "owners": ["*"], "read_only": true}
	  ]}`))
	if err != nil {
		t.Fatal(err)
	}
	caller := func(uid uint32) control.Caller {
		pr := control.Principal{Kind: control.Unix, UID: uid, GID: uid}
		return control.Caller{Principal: pr, Grant: p.Grant(pr)}
	}
	attached := leases.Record{Owner: "cni/pgnet", Principal: "uid:0", Attachment: &leases.Attachment{NetnsPath: "/run/netns/c1", IfName: "eth0"}}
	ownAttachment := attached
	ownAttachment.Principal = "uid:1000"
	leased := leases.Record{Owner: "sandbox-1", Principal: "uid:0"}
	for _, tc := range []struct {
		what string
		c    control.Caller
		rec  leases.Record
		want bool
	}{
		{"root, any attachment", caller(0), attached, true},
		{"root, any lease", caller(0), leased, true},
		{"leases cni/*, without attach", caller(1000), attached, false},
		{"leases cni/*, its own attachment", caller(1000), ownAttachment, true},
		{"leases sandbox-*", caller(1000), leased, true},
		{"attach for the network, root's attachment", caller(1001), attached, false},
		{"attach for the network, its own attachment", caller(1001), func() leases.Record { r := attached; r.Principal = "uid:1001"; return r }(), true},
		{"attach for the network, a lease of another owner", caller(1001), leased, false},
		{"reads everything", caller(1002), attached, false},
		{"reads everything, a lease", caller(1002), leased, false},
	} {
		if got := MayAct(tc.c, tc.rec); got != tc.want {
			t.Errorf("%s: MayAct %v, want %v", tc.what, got, tc.want)
		}
	}
}
