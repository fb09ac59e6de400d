package phases

import (
	"cmp"
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/slot"
)

// leaseCheck is the verification a restored lease still waits for. One
// caller at a time runs it (the background task, or a Release, an Acquire
// retry or an expiry of that lease); the others wait for done. A check
// that fails is replaced by a fresh one, unclaimed, and done is closed, so
// that a waiter runs it again.
type leaseCheck struct {
	claimed bool          // being run (under slotsService.mu)
	done    chan struct{} // closed once the lease is settled or the run failed
}

func newLeaseCheck() *leaseCheck { return &leaseCheck{done: make(chan struct{})} }

// verdict is what verifying a restored lease's slot found: intact (its host
// side repaired), lost (why), or nothing certain (err: the check is run
// again later).
type verdict struct {
	lost string
	err  error
}

// leaseVerifier checks restored leases' slots against their records and
// repairs their host side (the daemon's, restore.go): one verdict per
// slot, in order, and reports the leases found lost once their state says
// so.
type leaseVerifier interface {
	verify(ctx context.Context, slots []*slot.Slot) []verdict
	reportLost(lost []leases.Record, reasons []string)
}

// settle verifies restored lease l if it still waits for that, or waits
// for the check under way: on a nil return l is ACQUIRED or LOST.
func (s *slotsService) settle(ctx context.Context, l *lease) error {
	for {
		s.mu.Lock()
		c := l.check
		if c == nil {
			s.mu.Unlock()
			return nil
		}
		if !c.claimed {
			c.claimed = true
			s.mu.Unlock()
			_, err := s.runChecks(ctx, []*lease{l})
			return err
		}
		s.mu.Unlock()
		select {
		case <-c.done:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// verifyRestored verifies those of ls that still wait for it and that
// nobody else is verifying, and returns how many it settled and the first
// error of those it could not (they stay VERIFYING, for a later try).
func (s *slotsService) verifyRestored(ctx context.Context, ls []*lease) (settled int, err error) {
	s.mu.Lock()
	var mine []*lease
	for _, l := range ls {
		// A lease ended meanwhile is settled by whoever ended it.
		if l.check != nil && !l.check.claimed && s.leased[l.rec.Index] == l {
			l.check.claimed = true
			mine = append(mine, l)
		}
	}
	s.mu.Unlock()
	return s.runChecks(ctx, mine)
}

// runChecks verifies ls, which the caller claimed, and settles each by its
// verdict: ACQUIRED, LOST (its index stays the lease's, with no slot), or
// unclaimed again when nothing certain was found.
func (s *slotsService) runChecks(ctx context.Context, ls []*lease) (settled int, err error) {
	if len(ls) == 0 {
		return 0, nil
	}
	// A claimed lease's slot changes only here, by its claimer.
	slots := make([]*slot.Slot, len(ls))
	for i, l := range ls {
		slots[i] = l.slot
	}
	vs := s.verifier.verify(ctx, slots)
	var lost []leases.Record
	var reasons []string
	for i, l := range ls {
		v := vs[i]
		if v.lost != "" {
			if perr := s.pool.Lose(l.slot); perr != nil {
				s.log.Warn("lost lease's slot was not the pool's", "slot", l.rec.Index, "error", perr)
			}
		}
		s.mu.Lock()
		c := l.check
		switch {
		case v.err != nil:
			l.check = newLeaseCheck()
			err = cmp.Or(err, v.err)
		case v.lost != "":
			l.slot, l.lostReason, l.check = nil, v.lost, nil
			lost, reasons = append(lost, l.rec), append(reasons, v.lost)
			settled++
		default:
			l.check = nil
			settled++
		}
		s.mu.Unlock()
		close(c.done)
	}
	if len(lost) > 0 {
		s.verifier.reportLost(lost, reasons)
	}
	if err != nil {
		return settled, status.Errorf(codes.Unavailable, "a restored lease's slot could not be verified yet (retry): %v", err)
	}
	return settled, nil
}

// outcome returns how many of ls still wait for their verification, and
// how many were found lost.
func (s *slotsService) outcome(ls []*lease) (unverified, lost int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range ls {
		switch {
		case l.check != nil:
			unverified++
		case l.slot == nil:
			lost++
		}
	}
	return unverified, lost
}
