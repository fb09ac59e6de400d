package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/internal/flagname"
)

// ParseEgress checks a client's egress policy in its message form (the
// Slots API's proto, the CNI plugin's wire; nil: none) over the daemon's
// part d: an invalid one is refused as ErrInvalid, and so is one d cannot
// write (egress.Defaults.Admit), its message naming the daemon's flag.
func ParseEgress[M interface {
	*T
	egress.Message
}, T any](m M, d egress.Defaults) (*egress.Policy, error) {
	pol, err := egress.FromMessage(m)
	if err == nil && pol != nil {
		err = d.Admit(*pol)
	}
	if err != nil {
		return nil, wrapError(ErrInvalid, err, flagname.Shown(err))
	}
	return pol, nil
}

// EgressEntriesPerCall is how many ranges of an egress policy cost the
// principal one more call of its rate (control.Charge). Writing a policy
// costs the daemon about a call's work for every few dozen ranges, on the
// host's nftables, which every slot operation shares, and in the slot: a
// principal that writes policies of thousands of ranges in a loop would
// otherwise take that lock and the CPU from everyone else at the rate of
// small calls (docs/BENCHMARKS.md, "The per-slot host rules").
const EgressEntriesPerCall = 64

// EgressCost is how many calls beyond its own a call writing p costs:
// 128 for the largest policy (4,096 ranges in each list), none for a
// handful of ranges or none.
func EgressCost(p *egress.Policy) int {
	if p == nil {
		return 0
	}
	return (len(p.Allow) + len(p.Deny)) / EgressEntriesPerCall
}

// applyEgress writes p for slot sl, on the host and inside; nil clears
// the slot's policy.
func (s *Service) applyEgress(ctx context.Context, sl *slot.Slot, p *egress.Policy) error {
	if p == nil {
		return s.mgr.ClearEgress(ctx, sl)
	}
	return s.mgr.ApplyEgress(ctx, sl, *p)
}

// lockPolicy takes the lock of slot i's egress policy (see policyMu) and
// returns its unlock. Indices beyond --slots (lost leases, which have no
// slot) share index 0's.
func (s *Service) lockPolicy(i int) (unlock func()) {
	if i < 0 || i >= len(s.policyMu) {
		i = 0
	}
	mu := &s.policyMu[i]
	mu.Lock()
	return mu.Unlock
}

// SetEgress replaces the egress policy of slot i's lease, whose id is
// leaseID, for caller c with the policy parse makes of the request (over
// the daemon's part of every policy; nil: none), and answers the lease:
// authorized as Release (before the policy is parsed), the rules replaced
// in one transaction, then the record; a record that cannot be written
// puts the old rules back.
func (s *Service) SetEgress(ctx context.Context, c control.Caller, i int, leaseID string, parse func(egress.Defaults) (*egress.Policy, error)) (Lease, error) {
	if err := s.leaseCall(ctx, c, i, leaseID); err != nil {
		return Lease{}, err
	}
	pol, err := parse(s.egress)
	if err != nil {
		return Lease{}, err
	}
	if err := control.Charge(ctx, EgressCost(pol)); err != nil {
		return Lease{}, err
	}
	cur, unlock, err := s.lockedLease(ctx, i, leaseID, "a policy")
	if err != nil {
		return Lease{}, err
	}
	defer unlock()
	old, sl := cur.Rec, cur.Slot
	// Written with the request's context: a caller gone halfway leaves
	// the old policy put back below, or the new one recorded.
	wctx := context.WithoutCancel(ctx)
	dropped := s.hostDrops(wctx, i, sl, old.Egress)
	if err := s.applyEgress(wctx, sl, pol); err != nil {
		if !errors.Is(err, slot.ErrGone) {
			s.restoreEgress(wctx, i, sl, old.Egress)
		}
		return Lease{}, egressError(i, err)
	}
	rec, err := s.updateLease(ctx, i, leaseID, func(r *leases.Record) {
		r.Egress = pol
		// The new rules count from 0: the lease's ledger carries what
		// the old ones dropped.
		r.Ledger = r.Ledger.Repoliced(dropped)
	})
	if err != nil {
		// The record keeps the old policy: so must the slot.
		s.restoreEgress(wctx, i, sl, old.Egress)
		return Lease{}, leaseError(i, err)
	}
	s.table.setRecordOf(rec)
	s.count("egress_policy_set")
	s.log.Info("egress policy set", "slot", i, "owner", names.Shown(rec.Owner), "principal", c.Principal.String(), "policy", describePolicy(rec.Egress))
	return Lease{Rec: rec, Slot: sl}, nil
}

// lockedLease answers a copy of slot i's lease, whose id must be leaseID,
// for a change of what its slot holds (what: "a policy", "limits"), and
// the unlock of the slot's policy lock, which it holds. One change of a
// slot's policy or limits at a time: the kernel and the record must end
// up saying the same. Other slots' changes go on meanwhile. A lease
// restored at a restart is verified first: its slot may turn out lost.
func (s *Service) lockedLease(ctx context.Context, i int, leaseID, what string) (Lease, func(), error) {
	if l := s.table.at(i); l != nil {
		if err := s.Settle(ctx, l); err != nil {
			return Lease{}, nil, err
		}
	}
	unlock := s.lockPolicy(i)
	cur := s.table.copyAt(i)
	var err error
	switch {
	case cur == nil:
		err = leaseError(i, leases.ErrNotFound)
	case !sameLease(cur.Rec.LeaseID, leaseID):
		err = leaseError(i, errWrongLease)
	case cur.Slot == nil:
		err = Errorf(ErrPrecondition, "slot %d: the lease is lost (%s): it has no slot to set %s on", i, cur.LostReason, what)
	}
	if err != nil {
		unlock()
		return Lease{}, nil, err
	}
	return *cur, unlock, nil
}

// updateLease records change to slot i's lease, if it is still lease
// leaseID.
func (s *Service) updateLease(ctx context.Context, i int, leaseID string, change func(*leases.Record)) (leases.Record, error) {
	return s.records.update(ctx, i, func(r *leases.Record) error {
		if r.State != leases.Leased {
			return leases.ErrNotFound
		}
		if !sameLease(r.LeaseID, leaseID) {
			return errWrongLease
		}
		change(r)
		return nil
	})
}

// hostDrops reads how many packets slot i's policy p dropped on the host,
// before its rules are written again; 0 for no policy, or when the
// counter cannot be read (said in the log: the lease's usage then misses
// them).
func (s *Service) hostDrops(ctx context.Context, i int, sl *slot.Slot, p *egress.Policy) uint64 {
	if p == nil {
		return 0
	}
	st, err := s.mgr.Firewall().EgressOf(ctx, sl.HostIf)
	if err != nil {
		s.log.Warn("egress policy: the old rules' drop counter is unreadable; the lease's usage misses what they dropped", "slot", i, "error", err)
		return 0
	}
	return st.Drops
}

// restoreEgress puts slot i's recorded policy back after a change that
// failed halfway (one side written, or the record not), so that the rules
// and the record say the same.
func (s *Service) restoreEgress(ctx context.Context, i int, sl *slot.Slot, prev *egress.Policy) {
	if err := s.applyEgress(ctx, sl, prev); err != nil {
		s.log.Error("egress policy: a change failed and the recorded rules could not be put back", "slot", i, "error", err)
	}
}

// egressError maps a failure to write a policy: a slot gone meanwhile (a
// concurrent Release) is a precondition, the rest internal.
func egressError(i int, err error) error {
	if errors.Is(err, egress.ErrInvalid) {
		return Errorf(ErrInvalid, "%s", flagname.Shown(err))
	}
	if errors.Is(err, slot.ErrGone) {
		return Errorf(ErrPrecondition, "slot %d: %v", i, err)
	}
	return Errorf(ErrInternal, "slot %d: write the egress policy: %v", i, err)
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
func (s *Service) egressDrops(ctx context.Context, l *Lease) uint64 {
	if l == nil || l.Slot == nil || l.Rec.Egress == nil {
		return 0
	}
	n, err := s.mgr.EgressDrops(ctx, l.Slot)
	if err != nil {
		s.log.Warn("egress drop counters unreadable", "slot", l.Rec.Index, "error", err)
	}
	return n
}
