package control_test

import (
	"fmt"
	"strings"

	"github.com/phasegate/phasegate/control"
)

// A policy says what each principal may do; root on the socket may do
// everything without a rule, anyone else only what a rule grants.
func ExampleAccessPolicy_Grant() {
	p, err := control.ParsePolicy(strings.NewReader(`{
	  "max_leases": 16,
	  "principals": [
	    {"uid": 1000, "owners": ["sandbox-*"]},
	    {"identity": "spiffe://example.org/ns/ci/*", "owners": ["ci-*"], "read_only": true}
	  ]}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	orchestrator := control.Principal{Kind: control.Unix, UID: 1000, GID: 1000}
	ci := control.Principal{Kind: control.URISAN, Identity: "spiffe://example.org/ns/ci/sa/builder"}
	stranger := control.Principal{Kind: control.Unix, UID: 65534, GID: 65534}
	for _, pr := range []control.Principal{orchestrator, ci, stranger} {
		g := p.Grant(pr)
		fmt.Printf("%s: lease sandbox-1 %v, read ci-7 %v, nothing at all %v, quota %d\n",
			pr, g.MayLease("sandbox-1"), g.MayRead("ci-7"), g.Empty(), g.MaxLeases)
	}
	// Output:
	// uid:1000: lease sandbox-1 true, read ci-7 false, nothing at all false, quota 16
	// x509:uri:spiffe://example.org/ns/ci/sa/builder: lease sandbox-1 false, read ci-7 true, nothing at all false, quota 16
	// uid:65534: lease sandbox-1 false, read ci-7 false, nothing at all true, quota 16
}
