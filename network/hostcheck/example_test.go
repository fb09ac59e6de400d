package hostcheck_test

import (
	"context"
	"log"

	"github.com/phasegate/phasegate/network/hostcheck"
	"github.com/phasegate/phasegate/network/slot"
)

// A daemon checks the host once its slot table exists, logs each problem
// and raises a health warning while any is left.
func ExampleCheck() {
	cfg := slot.DefaultConfig()
	r := hostcheck.Check(context.Background(), hostcheck.Config{
		Table:        cfg.TableName(),
		HostIfPrefix: cfg.HostIfPrefix(),
	})
	for _, p := range r.Problems {
		log.Printf("slot egress: %s", p) // e.g. "forwarding: net.ipv4.ip_forward is 0: ... run `sysctl -w net.ipv4.ip_forward=1` ..."
	}
	if !r.OK() {
		log.Printf("slots may not reach the network: %d problem(s)", len(r.Problems))
	}
}
