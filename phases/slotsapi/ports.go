package slotsapi

import (
	"context"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/ports"
	"github.com/phasegate/phasegate/phases/lease"
)

// SetPorts implements phasegate.v1.Slots.
func (s *Server) SetPorts(ctx context.Context, req *phasegatev1.SetPortsRequest) (*phasegatev1.SetPortsResponse, error) {
	c, err := CallerOf(ctx)
	if err != nil {
		return nil, err
	}
	ms, err := lease.ParsePorts(req.GetPorts())
	if err != nil {
		return nil, Status(err)
	}
	l, err := s.leases.SetPorts(ctx, c, int(req.GetIndex()), req.GetLeaseId(), ms)
	if err != nil {
		return nil, Status(err)
	}
	return &phasegatev1.SetPortsResponse{Slot: s.describe(lease.Slot{Index: l.Rec.Index, State: l.State(), Lease: &l}, c)}, nil
}

// portsProto is a lease's published ports in the Slots API's form, each
// protocol named.
func portsProto(ms []ports.Mapping) []*phasegatev1.PublishedPort {
	return ports.ToMessages(ms, func(ip string, hp, sp uint32, p string) *phasegatev1.PublishedPort {
		return &phasegatev1.PublishedPort{HostIp: ip, HostPort: hp, SlotPort: sp, Protocol: p}
	})
}
