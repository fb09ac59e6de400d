package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
)

// errWrongLease refuses a lease id that is not the slot's lease.
var errWrongLease = errors.New("wrong lease id")

// endLease removes the slot's lease record if leaseID is its lease (any
// lease when leaseID is ""), and forgets the lease. The caller gives the
// slot back.
func (s *Service) endLease(ctx context.Context, i int, leaseID string) (*Lease, error) {
	_, err := s.records.update(ctx, i, func(r *leases.Record) error {
		if r.State != leases.Leased {
			return leases.ErrNotFound
		}
		if leaseID != "" && !sameLease(r.LeaseID, leaseID) {
			return errWrongLease
		}
		return leases.ErrRemove
	})
	if err != nil {
		return nil, err
	}
	return s.table.remove(i), nil
}

// leaseError maps a lease check to the error Release and KeepAlive answer.
func leaseError(i int, err error) error {
	switch {
	case errors.Is(err, leases.ErrNotFound):
		return Errorf(ErrPrecondition, "slot %d is not leased", i)
	case errors.Is(err, errWrongLease):
		return Errorf(ErrDenied, "slot %d: lease_id is not this slot's lease", i)
	case errors.Is(err, leases.ErrNoSpace):
		return wrapError(ErrExhausted, err, fmt.Sprintf("slot %d: cannot record the change: the daemon's state filesystem is full", i))
	}
	return Errorf(ErrInternal, "slot %d: %v", i, err)
}

// mayChange refuses a Release or KeepAlive of slot i by a caller that is
// neither the principal of its lease nor one the policy lets act for the
// lease's owner. A slot that is not leased is left for the lease check to
// answer, the same for every caller.
func (s *Service) mayChange(ctx context.Context, c control.Caller, i int) error {
	l := s.table.copyAt(i)
	if l == nil {
		return nil
	}
	control.Note(ctx, "owner", names.Shown(l.Rec.Owner))
	if MayAct(c, l.Rec) {
		return nil
	}
	return Errorf(ErrDenied, "slot %d: %s may not act for the owner of its lease", i, c.Principal)
}

// MayAct reports whether caller c may change lease rec: it is the lease's
// principal, or one the policy lets act for its owner. A CNI attachment
// is its principal's and root's alone: neither leasing its network's
// owner nor attach for it is enough (phases/cniapi).
func MayAct(c control.Caller, rec leases.Record) bool {
	switch {
	case rec.Principal == c.Principal.String():
		return true
	case rec.Attachment != nil:
		return c.Principal.IsRoot()
	}
	return c.Grant.MayLease(rec.Owner)
}

// leaseCall is the opening of every call on a lease (Release,
// KeepAlive, SetEgress): the index in range and noted for the audit line,
// a lease id given, and the caller allowed to act for the lease's owner.
// The lease id itself is compared where the record is read.
func (s *Service) leaseCall(ctx context.Context, c control.Caller, i int, leaseID string) error {
	if err := s.checkIndex(i); err != nil {
		return err
	}
	control.Note(ctx, "slot", i)
	if leaseID == "" {
		return Errorf(ErrDenied, "slot %d: lease_id is required", i)
	}
	return s.mayChange(ctx, c, i)
}

// Release ends the lease of slot i whose id is leaseID, for caller c, and
// gives its slot back to the pool.
func (s *Service) Release(ctx context.Context, c control.Caller, i int, leaseID string) error {
	if err := s.leaseCall(ctx, c, i, leaseID); err != nil {
		return err
	}
	l, err := s.endLease(ctx, i, leaseID)
	if err != nil {
		return leaseError(i, err)
	}
	u := s.giveBack(context.WithoutCancel(ctx), l)
	s.count("released")
	s.log.Info("slot released", append([]any{"slot", i, "owner", names.Shown(l.Rec.Owner), "principal", c.Principal.String(),
		"held", time.Since(l.Rec.Acquired).Round(time.Millisecond).String()}, usageAttrs(u)...)...)
	return nil
}

// KeepAlive renews the lease of slot i whose id is leaseID, for caller c,
// for another TTL, and answers its record.
func (s *Service) KeepAlive(ctx context.Context, c control.Caller, i int, leaseID string) (leases.Record, error) {
	if err := s.leaseCall(ctx, c, i, leaseID); err != nil {
		return leases.Record{}, err
	}
	now := time.Now()
	rec, err := s.records.update(ctx, i, func(r *leases.Record) error {
		if r.State != leases.Leased {
			return leases.ErrNotFound
		}
		if !sameLease(r.LeaseID, leaseID) {
			return errWrongLease
		}
		if r.TTL > 0 {
			r.Expires = now.Add(r.TTL)
		}
		return nil
	})
	if err != nil {
		return leases.Record{}, leaseError(i, err)
	}
	s.table.setRecordOf(rec)
	return rec, nil
}

// Get answers slot i as caller c may see it; a leased slot's inside is
// verified, and what its root changed put back.
func (s *Service) Get(ctx context.Context, c control.Caller, i int) (Slot, error) {
	if err := s.checkIndex(i); err != nil {
		return Slot{}, err
	}
	out := s.view().at(i)
	if out.Lease != nil && !c.Grant.MayRead(out.Lease.Rec.Owner) {
		return Slot{}, Errorf(ErrDenied, "slot %d is leased to an owner %s may not see", i, c.Principal)
	}
	l := s.table.copyAt(i)
	if l != nil && l.Slot != nil {
		// What the slot's root changed is seen here, and put back.
		repaired, err := s.repairLease(ctx, l.Rec.Index, l.Rec.LeaseID)
		if err != nil {
			s.log.Warn("get: the slot could not be verified", "slot", l.Rec.Index, "error", err)
		} else if len(repaired) > 0 {
			s.log.Warn("lease: inside of its slot repaired", "slot", l.Rec.Index, "owner", names.Shown(l.Rec.Owner), "repaired", strings.Join(repaired, ", "), "by", "get")
		}
		out.Repaired = repaired
		out.EgressDrops = s.egressDrops(ctx, l)
	}
	if l != nil {
		if u, seen, err := s.usageNow(ctx, l); err != nil {
			s.log.Warn("get: the lease's counters are unreadable", "slot", i, "error", err)
		} else {
			out.Usage = &u
			s.table.seen(i, seen.ifindex, seen.counts)
		}
	}
	return out, nil
}

// List answers every slot (indices 1..N in order), or every slot that is
// not free, as caller c may see them: the leases of owners it may not
// read left out.
func (s *Service) List(c control.Caller, includeFree bool) []Slot {
	v := s.view()
	var out []Slot
	for i := 1; i <= v.n; i++ {
		sl := v.at(i)
		if sl.State == StateFree && !includeFree || sl.Lease != nil && !c.Grant.MayRead(sl.Lease.Rec.Owner) {
			continue
		}
		out = append(out, sl)
	}
	s.usageListed(out)
	return out
}

// ByRequest returns a copy of the lease an earlier Acquire of owner's
// request took, lost ones included.
func (s *Service) ByRequest(owner, requestID string) (Lease, bool) {
	l, ok := s.table.byRequest(owner, requestID)
	if !ok {
		return Lease{}, false
	}
	return s.table.copyOf(l), true
}

// SettledByRequest is ByRequest once the lease, if restored at a start, is
// verified (ACQUIRED or LOST).
func (s *Service) SettledByRequest(ctx context.Context, owner, requestID string) (Lease, bool, error) {
	l, ok := s.table.byRequest(owner, requestID)
	if !ok {
		return Lease{}, false, nil
	}
	if err := s.Settle(ctx, l); err != nil {
		return Lease{}, true, err
	}
	return s.table.copyOf(l), true, nil
}

// At returns a copy of the lease of slot i, nil if none.
func (s *Service) At(i int) *Lease { return s.table.copyAt(i) }

// Leases returns a copy of every lease, by index.
func (s *Service) Leases() map[int]*Lease { return s.table.copies() }

// End ends the lease recorded as rec, unless it ended (and perhaps a new
// one began at its index) meanwhile, and gives its slot to the pool
// through put (pool.Put, Retire or Discard: [Service.Pool]). It reports
// whether it ended the lease.
func (s *Service) End(ctx context.Context, rec leases.Record, put func(context.Context, *slot.Slot) error) (bool, error) {
	l, err := s.endLease(ctx, rec.Index, rec.LeaseID)
	switch {
	case errors.Is(err, leases.ErrNotFound) || errors.Is(err, errWrongLease):
		return false, nil
	case err != nil:
		return false, leaseError(rec.Index, err)
	}
	s.giveBackBy(context.WithoutCancel(ctx), l, put)
	s.count("released")
	return true, nil
}

// Pool returns the pool the core's slots come from.
func (s *Service) Pool() *pool.Pool { return s.pool }

// SlotOwning returns the index of the leased slot whose own namespace is
// id, if one is.
func (s *Service) SlotOwning(id netns.ID) (int, bool) { return s.table.slotOwning(id) }

// changedLease readies a change of slot i's lease whose id is leaseID
// (its egress policy, its published ports, its bandwidth limits): a
// lease restored at a
// restart verified first (its slot may turn out lost), then the slot's
// lock taken (lockPolicy: one change of a slot at a time, so that its
// kernel state and its record end up saying the same; other slots'
// changes go on meanwhile), and a copy of the lease answered, its slot
// there. unlock is always to be called; what names the change in the
// refusal of a lost lease.
func (s *Service) changedLease(ctx context.Context, i int, leaseID, what string) (cur *Lease, unlock func(), err error) {
	if l := s.table.at(i); l != nil {
		if err := s.Settle(ctx, l); err != nil {
			return nil, func() {}, err
		}
	}
	unlock = s.lockPolicy(i)
	cur = s.table.copyAt(i)
	switch {
	case cur == nil:
		return nil, unlock, leaseError(i, leases.ErrNotFound)
	case !sameLease(cur.Rec.LeaseID, leaseID):
		return nil, unlock, leaseError(i, errWrongLease)
	case cur.Slot == nil:
		return nil, unlock, Errorf(ErrPrecondition, "slot %d: the lease is lost (%s): it has no slot to %s", i, cur.LostReason, what)
	}
	return cur, unlock, nil
}

// updateLease changes the record of slot i's lease whose id is leaseID
// with set, in one transaction that checks it is still that lease.
func (s *Service) updateLease(ctx context.Context, i int, leaseID string, set func(*leases.Record)) (leases.Record, error) {
	return s.records.update(ctx, i, func(r *leases.Record) error {
		if r.State != leases.Leased {
			return leases.ErrNotFound
		}
		if !sameLease(r.LeaseID, leaseID) {
			return errWrongLease
		}
		set(r)
		return nil
	})
}
