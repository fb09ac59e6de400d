package slotsapi

import (
	"context"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/shape"
	"github.com/phasegate/phasegate/phases/lease"
)

// parseBandwidth checks a client's limits and fills in their default
// bursts; nil is none.
func parseBandwidth(b *phasegatev1.Bandwidth) (*shape.Limits, error) {
	return lease.ParseBandwidth(limitsOf(b))
}

// limitsOf is a client's limits as given; nil is none.
func limitsOf(b *phasegatev1.Bandwidth) *shape.Limits {
	if b == nil {
		return nil
	}
	return &shape.Limits{IngressRate: b.GetIngressRate(), IngressBurst: b.GetIngressBurst(), EgressRate: b.GetEgressRate(), EgressBurst: b.GetEgressBurst()}
}

// bandwidthProto is a lease's limits for a reply.
func bandwidthProto(l *shape.Limits) *phasegatev1.Bandwidth {
	if l == nil {
		return nil
	}
	return &phasegatev1.Bandwidth{IngressRate: l.IngressRate, IngressBurst: l.IngressBurst, EgressRate: l.EgressRate, EgressBurst: l.EgressBurst}
}

// SetBandwidth implements phasegate.v1.Slots.
func (s *Server) SetBandwidth(ctx context.Context, req *phasegatev1.SetBandwidthRequest) (*phasegatev1.SetBandwidthResponse, error) {
	c, err := CallerOf(ctx)
	if err != nil {
		return nil, err
	}
	l, err := s.leases.SetBandwidth(ctx, c, int(req.GetIndex()), req.GetLeaseId(), limitsOf(req.GetBandwidth()))
	if err != nil {
		return nil, Status(err)
	}
	return &phasegatev1.SetBandwidthResponse{Slot: s.describe(lease.Slot{Index: l.Rec.Index, State: l.State(), Lease: &l}, c)}, nil
}
