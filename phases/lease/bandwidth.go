package lease

import (
	"context"
	"errors"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/shape"
	"github.com/phasegate/phasegate/network/slot"
)

// ParseBandwidth checks a client's bandwidth limits (the Slots API's, the
// CNI capability's; nil: none) and fills in their default bursts: limits
// the kernel cannot hold are refused as ErrInvalid.
func ParseBandwidth(l *shape.Limits) (*shape.Limits, error) {
	if l == nil {
		return nil, nil
	}
	w := l.WithDefaults()
	if err := w.Validate(); err != nil {
		return nil, wrapError(ErrInvalid, err, err.Error())
	}
	return &w, nil
}

// applyBandwidth sets limits l on slot sl's host link; nil clears them.
func (s *Service) applyBandwidth(ctx context.Context, sl *slot.Slot, l *shape.Limits) error {
	if l == nil {
		return shape.Clear(ctx, s.mgr.ShapeLink(sl))
	}
	return shape.Apply(ctx, s.mgr.ShapeLink(sl), *l)
}

// bandwidthError maps a failure to set limits: a host link gone meanwhile
// is a precondition, the rest internal.
func bandwidthError(i int, err error) error {
	if errors.Is(err, shape.ErrNoLink) {
		return Errorf(ErrPrecondition, "slot %d: %v", i, err)
	}
	return Errorf(ErrInternal, "slot %d: set the bandwidth limits: %v", i, err)
}

// SetBandwidth replaces the bandwidth limits of slot i's lease, whose id
// is leaseID, for caller c (nil: none), and answers the lease: authorized
// as SetEgress, the limits replaced in place on the host link, then the
// record; a record that cannot be written puts the old limits back.
func (s *Service) SetBandwidth(ctx context.Context, c control.Caller, i int, leaseID string, want *shape.Limits) (Lease, error) {
	if err := s.leaseCall(ctx, c, i, leaseID); err != nil {
		return Lease{}, err
	}
	bw, err := ParseBandwidth(want)
	if err != nil {
		return Lease{}, err
	}
	cur, unlock, err := s.changedLease(ctx, i, leaseID, "set limits on")
	defer unlock()
	if err != nil {
		return Lease{}, err
	}
	old, sl := cur.Rec.Bandwidth, cur.Slot
	wctx := context.WithoutCancel(ctx)
	if err := s.applyBandwidth(wctx, sl, bw); err != nil {
		s.restoreBandwidth(wctx, i, sl, old)
		return Lease{}, bandwidthError(i, err)
	}
	rec, err := s.updateLease(ctx, i, leaseID, func(r *leases.Record) { r.Bandwidth = bw })
	if err != nil {
		s.restoreBandwidth(wctx, i, sl, old)
		return Lease{}, leaseError(i, err)
	}
	s.table.setRecordOf(rec)
	s.count("bandwidth_set")
	s.log.Info("bandwidth limits set", "slot", i, "owner", names.Shown(rec.Owner), "principal", c.Principal.String(), "limits", describeBandwidth(bw))
	return Lease{Rec: rec, Slot: sl}, nil
}

// restoreBandwidth puts slot i's recorded limits back after a change that
// failed halfway.
func (s *Service) restoreBandwidth(ctx context.Context, i int, sl *slot.Slot, prev *shape.Limits) {
	if err := s.applyBandwidth(ctx, sl, prev); err != nil && !errors.Is(err, shape.ErrNoLink) {
		s.log.Error("bandwidth limits: a change failed and the recorded limits could not be put back", "slot", i, "error", err)
	}
}

// repairBandwidth puts lease limits l (nil: none) back on slot sl's link
// if they are not what holds it (a qdisc, the redirect or the ifb deleted
// or changed on the host), and names what it repaired.
func (s *Service) repairBandwidth(ctx context.Context, sl *slot.Slot, l *shape.Limits) ([]string, error) {
	var want shape.Limits
	if l != nil {
		want = *l
	}
	did, err := shape.Repair(ctx, s.mgr.ShapeLink(sl), want)
	if err != nil || !did {
		return nil, err
	}
	return []string{"bandwidth limits"}, nil
}

// clearBandwidth removes the limits of a slot about to be put back warm
// (its ifb outlives its links). It reports whether the slot is clean:
// one that is not is torn down rather than put back warm.
func (s *Service) clearBandwidth(ctx context.Context, sl *slot.Slot) bool {
	err := shape.Clear(context.WithoutCancel(ctx), s.mgr.ShapeLink(sl))
	if err != nil {
		s.log.Warn("bandwidth limits could not be cleared; the reconciler's survey finds the slot's ifb", "slot", sl.Index, "error", err)
	}
	return err == nil
}

// dropUnleased gives back slot sl of a lease that did not happen: its
// limits cleared first if it had any (hadLimits), the attachment made for
// it undone (made), or the slot returned warm without the policy written
// for it (hadPolicy); a slot whose limits could not be cleared is torn
// down and made again, not put back warm.
func (s *Service) dropUnleased(ctx context.Context, sl *slot.Slot, made *slot.Attachment, hadPolicy, hadLimits bool) {
	clean := !hadLimits || s.clearBandwidth(ctx, sl)
	switch {
	case made != nil:
		s.unattach(ctx, sl)
	case !clean:
		if err := s.pool.Put(context.WithoutCancel(ctx), sl); err != nil {
			s.log.Warn("slot not leased could not be made again", "slot", sl.Index, "error", err)
		}
	default:
		s.returnUnleased(sl, hadPolicy)
	}
}

// describeBandwidth is limits for a log line.
func describeBandwidth(l *shape.Limits) string {
	if l == nil {
		return "none"
	}
	return l.String()
}
