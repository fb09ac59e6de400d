package slotsapi

import (
	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/inside"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/phases/lease"
)

// parseEgress checks a client's policy; nil is none.
func parseEgress(p *phasegatev1.EgressPolicy, d inside.Defaults) (*inside.Policy, error) {
	if p == nil {
		return nil, nil
	}
	return lease.ParseEgress(p.GetAllow(), p.GetDeny(), p.GetDenyAll(), p.GetRedirectTcp(), d)
}

// egressProto is a recorded policy for a reply.
func egressProto(e *leases.EgressPolicy) *phasegatev1.EgressPolicy {
	if e == nil {
		return nil
	}
	return &phasegatev1.EgressPolicy{Allow: e.Allow, Deny: e.Deny, DenyAll: e.DenyAll, RedirectTcp: e.RedirectTCP}
}
