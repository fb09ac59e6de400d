package slotsapi

import (
	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/phases/lease"
)

// parseEgress checks a client's policy; nil is none.
func parseEgress(p *phasegatev1.EgressPolicy, d egress.Defaults) (*egress.Policy, error) {
	return lease.ParseEgress(p, d)
}

// egressProto is a lease's policy for a reply.
func egressProto(p *egress.Policy) *phasegatev1.EgressPolicy {
	return egress.ToMessage[phasegatev1.EgressPolicy](p)
}
