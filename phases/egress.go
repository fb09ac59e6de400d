package phases

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/internal/flagname"
)

// egressDefaults resolves the daemon's part of every egress policy: the
// configured sets, with the slot CIDR (every slot's gateway and every
// other slot) and the host's own addresses added to the always-denied.
// The host check reads those addresses (read is true) unless it did not
// run (an upgrade's new image): then they are read here.
func egressDefaults(cfg Config, host []netip.Prefix, read bool) (egress.Defaults, error) {
	d := cfg.Egress
	if !read {
		var err error
		if host, err = cfg.Slots.HostAddrs(); err != nil {
			return egress.Defaults{}, err
		}
	}
	d.AlwaysAllow = slices.Clone(d.AlwaysAllow)
	d.AlwaysDeny = append(append(slices.Clone(d.AlwaysDeny), cfg.Slots.CIDR), host...)
	return d, nil
}

// parseEgress checks a client's policy (the Slots API's or the CNI
// plugin's); nil is none.
func parseEgress[M interface {
	*T
	egress.Message
}, T any](m M, d egress.Defaults) (*egress.Policy, error) {
	pol, err := egress.FromMessage(m)
	if err == nil && pol != nil {
		err = d.Admit(*pol)
	}
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, flagname.Shown(err))
	}
	return pol, nil
}

// egressEntriesPerCall is how many ranges of an egress policy cost the
// principal one more call of its rate (control.Charge). Writing a policy
// costs the daemon about a call's work for every few dozen ranges, on the
// host's nftables, which every slot operation shares, and in the slot: a
// principal that writes policies of thousands of ranges in a loop would
// otherwise take that lock and the CPU from everyone else at the rate of
// small calls (docs/BENCHMARKS.md, "The per-slot host rules").
const egressEntriesPerCall = 64

// egressCost is how many calls beyond its own a call writing p costs:
// 128 for the largest policy (4,096 ranges in each list), none for a
// handful of ranges or none.
func egressCost(p *egress.Policy) int {
	if p == nil {
		return 0
	}
	return (len(p.Allow) + len(p.Deny)) / egressEntriesPerCall
}

// egressProto is a lease's policy for a reply.
func egressProto(p *egress.Policy) *phasegatev1.EgressPolicy {
	return egress.ToMessage[phasegatev1.EgressPolicy](p)
}

// applyEgress writes p for slot sl, on the host and inside; nil clears
// the slot's policy.
func (s *slotsService) applyEgress(ctx context.Context, sl *slot.Slot, p *egress.Policy) error {
	if p == nil {
		return s.mgr.ClearEgress(ctx, sl)
	}
	return s.mgr.ApplyEgress(ctx, sl, *p)
}

// lockPolicy takes the lock of slot i's egress policy (see policyMu) and
// returns its unlock. Indices beyond --slots (lost leases, which have no
// slot) share index 0's.
func (s *slotsService) lockPolicy(i int) (unlock func()) {
	if i < 0 || i >= len(s.policyMu) {
		i = 0
	}
	mu := &s.policyMu[i]
	mu.Lock()
	return mu.Unlock
}

// SetEgressPolicy implements phasegate.v1.Slots: authorized as Release,
// the rules replaced in one transaction, then the record; a record that
// cannot be written puts the old rules back.
func (s *slotsService) SetEgressPolicy(ctx context.Context, req *phasegatev1.SetEgressPolicyRequest) (*phasegatev1.SetEgressPolicyResponse, error) {
	c, i, err := s.leaseCall(ctx, req.GetIndex(), req.GetLeaseId())
	if err != nil {
		return nil, err
	}
	pol, err := parseEgress(req.GetEgressPolicy(), s.egress)
	if err != nil {
		return nil, err
	}
	if err := control.Charge(ctx, egressCost(pol)); err != nil {
		return nil, err
	}
	// A lease restored at a restart is verified first: its slot may turn
	// out lost.
	l := s.table.at(i)
	if l != nil {
		if err := s.settle(ctx, l); err != nil {
			return nil, err
		}
	}
	// One change of a slot's policy at a time: the rules and the record
	// must end up saying the same. Other slots' changes go on meanwhile.
	defer s.lockPolicy(i)()
	s.table.mu.Lock()
	l = s.table.leased[i]
	var old leases.Record
	var sl *slot.Slot
	lostReason := ""
	if l != nil {
		old, sl, lostReason = l.rec, l.slot, l.lostReason
	}
	s.table.mu.Unlock()
	switch {
	case l == nil:
		return nil, leaseError(i, leases.ErrNotFound)
	case !sameLease(old.LeaseID, req.GetLeaseId()):
		return nil, leaseError(i, errWrongLease)
	case sl == nil:
		return nil, status.Errorf(codes.FailedPrecondition, "slot %d: the lease is lost (%s): it has no slot to set a policy on", i, lostReason)
	}
	// Written with the request's context: a caller gone halfway leaves
	// the old policy put back below, or the new one recorded.
	wctx := context.WithoutCancel(ctx)
	if err := s.applyEgress(wctx, sl, pol); err != nil {
		if !errors.Is(err, slot.ErrGone) {
			s.restoreEgress(wctx, i, sl, old.Egress)
		}
		return nil, egressError(i, err)
	}
	rec, err := s.records.update(ctx, i, func(r *leases.Record) error {
		if r.State != leases.Leased {
			return leases.ErrNotFound
		}
		if !sameLease(r.LeaseID, req.GetLeaseId()) {
			return errWrongLease
		}
		r.Egress = pol
		return nil
	})
	if err != nil {
		// The record keeps the old policy: so must the slot.
		s.restoreEgress(wctx, i, sl, old.Egress)
		return nil, leaseError(i, err)
	}
	s.table.mu.Lock()
	if cur := s.table.leased[i]; cur != nil && cur.rec.LeaseID == rec.LeaseID {
		cur.rec = rec
	}
	s.table.mu.Unlock()
	s.count("egress_policy_set")
	s.log.Info("egress policy set", "slot", i, "owner", names.Shown(rec.Owner), "principal", c.Principal.String(), "policy", describePolicy(rec.Egress))
	// EgressDroppedPackets stays 0: the rules just written, on both
	// sides, count from 0, and reading them back would cost two more
	// round trips for what is known.
	out := s.describe(i, phasegatev1.SlotState_SLOT_STATE_ACQUIRED, &lease{rec: rec, slot: sl}, c)
	return &phasegatev1.SetEgressPolicyResponse{Slot: out}, nil
}

// restoreEgress puts slot i's recorded policy back after a change that
// failed halfway (one side written, or the record not), so that the rules
// and the record say the same.
func (s *slotsService) restoreEgress(ctx context.Context, i int, sl *slot.Slot, prev *egress.Policy) {
	if err := s.applyEgress(ctx, sl, prev); err != nil {
		s.log.Error("egress policy: a change failed and the recorded rules could not be put back", "slot", i, "error", err)
	}
}

// egressError maps a failure to write a policy: a slot gone meanwhile (a
// concurrent Release) is a precondition, the rest internal.
func egressError(i int, err error) error {
	if errors.Is(err, egress.ErrInvalid) {
		return status.Error(codes.InvalidArgument, flagname.Shown(err))
	}
	if errors.Is(err, slot.ErrGone) {
		return status.Errorf(codes.FailedPrecondition, "slot %d: %v", i, err)
	}
	return status.Errorf(codes.Internal, "slot %d: write the egress policy: %v", i, err)
}

// describePolicy is a policy for a log line.
func describePolicy(e *egress.Policy) string {
	if e == nil {
		return "none"
	}
	return fmt.Sprintf("allow %d, deny %d, deny_all %t, redirect_tcp %t", len(e.Allow), len(e.Deny), e.DenyAll, e.RedirectTCP)
}

// egressDrops reads how many packets lease l's egress policy dropped, on
// the host and inside (Get and SetEgressPolicy; List does not read every
// slot).
func (s *slotsService) egressDrops(ctx context.Context, l *lease) uint64 {
	if l == nil || l.slot == nil || l.rec.Egress == nil {
		return 0
	}
	n, err := s.mgr.EgressDrops(ctx, l.slot)
	if err != nil {
		s.log.Warn("egress drop counters unreadable", "slot", l.rec.Index, "error", err)
	}
	return n
}
