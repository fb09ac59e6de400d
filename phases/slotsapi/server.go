package slotsapi

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/phases/lease"
)

// ServiceName is the Slots API's full gRPC name.
var ServiceName = phasegatev1.Slots_ServiceDesc.ServiceName

// Desc is the Slots API's service description, which a server declares
// before it serves.
func Desc() *grpc.ServiceDesc { return &phasegatev1.Slots_ServiceDesc }

// Server serves phasegate.v1.Slots over the lease core: proto in, a Go
// call on [lease.Service] with the caller the control surface's guard
// named, proto or a status out. Every call must come through a
// [control.Guard]: one without a caller is refused.
type Server struct {
	phasegatev1.UnimplementedSlotsServer
	leases *lease.Service
}

// New returns the Slots API over svc.
func New(svc *lease.Service) *Server { return &Server{leases: svc} }

// CallerOf returns who makes the call. The control surface's guard puts
// the caller in every call it admits; a call without one came some other
// way and is refused.
func CallerOf(ctx context.Context) (control.Caller, error) {
	c, ok := control.CallerFrom(ctx)
	if !ok {
		return control.Caller{}, status.Error(codes.Unauthenticated, "the Slots API is served only on the control surface")
	}
	return c, nil
}

// Acquire implements phasegate.v1.Slots.
func (s *Server) Acquire(ctx context.Context, req *phasegatev1.AcquireRequest) (*phasegatev1.AcquireResponse, error) {
	// A TTL that is set must be positive: a client's arithmetic gone
	// wrong (a negative or zero TTL) must not be taken for "held until
	// released", which only an unset TTL asks for.
	ttl := req.GetTtl().AsDuration()
	if req.GetTtl() != nil && (!req.GetTtl().IsValid() || ttl <= 0) {
		return nil, status.Errorf(codes.InvalidArgument, "ttl %v: must be a positive duration (leave it unset for a lease held until released)", req.GetTtl().AsDuration())
	}
	pol, err := parseEgress(req.GetEgressPolicy(), s.leases.EgressDefaults())
	if err != nil {
		return nil, Status(err)
	}
	ms, err := lease.ParsePorts(req.GetPorts())
	if err != nil {
		return nil, Status(err)
	}
	bw, err := parseBandwidth(req.GetBandwidth())
	if err != nil {
		return nil, Status(err)
	}
	c, err := CallerOf(ctx)
	if err != nil {
		return nil, err
	}
	a, err := s.leases.Acquire(ctx, c, lease.Request{Owner: req.GetOwner(), RequestID: req.GetRequestId(), TTL: ttl, Egress: pol, Ports: ms, Bandwidth: bw})
	if err != nil {
		return nil, Status(err)
	}
	l := a.Lease
	return &phasegatev1.AcquireResponse{Slot: s.describe(lease.Slot{Index: l.Rec.Index, State: l.State(), Lease: &l}, c), LeaseId: l.Rec.LeaseID}, nil
}

// Release implements phasegate.v1.Slots.
func (s *Server) Release(ctx context.Context, req *phasegatev1.ReleaseRequest) (*phasegatev1.ReleaseResponse, error) {
	c, err := CallerOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.leases.Release(ctx, c, int(req.GetIndex()), req.GetLeaseId()); err != nil {
		return nil, Status(err)
	}
	return &phasegatev1.ReleaseResponse{}, nil
}

// KeepAlive implements phasegate.v1.Slots.
func (s *Server) KeepAlive(ctx context.Context, req *phasegatev1.KeepAliveRequest) (*phasegatev1.KeepAliveResponse, error) {
	c, err := CallerOf(ctx)
	if err != nil {
		return nil, err
	}
	rec, err := s.leases.KeepAlive(ctx, c, int(req.GetIndex()), req.GetLeaseId())
	if err != nil {
		return nil, Status(err)
	}
	resp := &phasegatev1.KeepAliveResponse{Ttl: durationpb.New(rec.TTL)}
	if !rec.Expires.IsZero() {
		resp.ExpiresAt = timestamppb.New(rec.Expires)
	}
	return resp, nil
}

// Get implements phasegate.v1.Slots.
func (s *Server) Get(ctx context.Context, req *phasegatev1.GetRequest) (*phasegatev1.GetResponse, error) {
	c, err := CallerOf(ctx)
	if err != nil {
		return nil, err
	}
	sl, err := s.leases.Get(ctx, c, int(req.GetIndex()))
	if err != nil {
		return nil, Status(err)
	}
	out := s.describe(sl, c)
	out.Repaired = append(out.Repaired, sl.Repaired...)
	out.EgressDroppedPackets = sl.EgressDrops
	return &phasegatev1.GetResponse{Slot: out}, nil
}

// List implements phasegate.v1.Slots.
func (s *Server) List(ctx context.Context, req *phasegatev1.ListRequest) (*phasegatev1.ListResponse, error) {
	c, err := CallerOf(ctx)
	if err != nil {
		return nil, err
	}
	return &phasegatev1.ListResponse{Slots: s.states(req.GetIncludeFree(), c)}, nil
}

// SetEgressPolicy implements phasegate.v1.Slots.
func (s *Server) SetEgressPolicy(ctx context.Context, req *phasegatev1.SetEgressPolicyRequest) (*phasegatev1.SetEgressPolicyResponse, error) {
	c, err := CallerOf(ctx)
	if err != nil {
		return nil, err
	}
	parse := func(d egress.Defaults) (*egress.Policy, error) { return parseEgress(req.GetEgressPolicy(), d) }
	l, err := s.leases.SetEgress(ctx, c, int(req.GetIndex()), req.GetLeaseId(), parse)
	if err != nil {
		return nil, Status(err)
	}
	// EgressDroppedPackets stays 0: the rules just written, on both
	// sides, count from 0, and reading them back would cost two more
	// round trips for what is known.
	return &phasegatev1.SetEgressPolicyResponse{Slot: s.describe(lease.Slot{Index: l.Rec.Index, State: l.State(), Lease: &l}, c)}, nil
}
