package lease

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/account"
	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
)

// The Slots service's side of the pool: a slot taken for a lease, one
// given back unleased, and the slot of an ended lease given back.

// takeSlot takes a slot from the pool for a lease, or says why it cannot.
func (s *Service) takeSlot(ctx context.Context) (*slot.Slot, error) {
	sl, err := s.pool.Get(ctx)
	switch {
	case errors.Is(err, pool.ErrClosed):
		return nil, Errorf(ErrUnavailable, "%s", "draining: the slot pool is closed")
	case errors.Is(err, index.ErrExhausted):
		return nil, Errorf(ErrExhausted, "all %d slots are leased or quarantined", s.cfg.Slots)
	case ctx.Err() != nil && err != nil:
		return nil, FromContext(ctx.Err())
	case err != nil:
		return nil, Errorf(ErrInternal, "make a slot: %v", err)
	}
	return sl, nil
}

// returnUnleased gives a slot that was not leased back to the pool, warm,
// without the egress policy written for the lease that did not happen.
// One whose policy cannot be cleared is put back as used instead: the pool
// tears it down and makes a fresh one.
func (s *Service) returnUnleased(sl *slot.Slot, hadPolicy bool) {
	if hadPolicy {
		if err := s.mgr.ClearEgress(context.Background(), sl); err != nil {
			s.log.Warn("slot not leased: its egress policy could not be cleared; the slot is made again", "slot", sl.Index, "error", err)
			if perr := s.pool.Put(context.Background(), sl); perr != nil {
				s.log.Warn("slot not leased could not be made again", "slot", sl.Index, "error", perr)
			}
			return
		}
	}
	if err := s.pool.Return(sl); err != nil {
		s.log.Warn("slot not leased could not go back to the pool", "slot", sl.Index, "error", err)
	}
}

// giveBack returns the slot of an ended lease to the pool, which tears it
// down and makes a fresh one in its place; a lost lease's index, which no
// slot occupies, goes back to the pool too, which frees it, once what is
// left of a slot lost while held is torn down.
func (s *Service) giveBack(ctx context.Context, l *Lease) account.Usage {
	return s.giveBackBy(ctx, l, s.pool.Put)
}

// giveBackBy is giveBack through put: pool.Put, which returns once the
// replacement is made too, pool.Retire, once the slot is torn down, or
// pool.Discard, at once. It answers the lease's usage, as read before the
// teardown, which it notes in the audit line of the call that ended the
// lease, if any (a Release, a CNI DEL or GC).
func (s *Service) giveBackBy(ctx context.Context, l *Lease, put func(context.Context, *slot.Slot) error) account.Usage {
	if l == nil {
		return account.Usage{}
	}
	// The lease is out of the table already; its fields are read under
	// the table's lock all the same, as everywhere.
	i := s.table.copyOf(l).Rec.Index
	if err := s.Settle(ctx, l); err != nil {
		// Whatever is at the index is this lease's or dead: the pool's
		// teardown, by name and idempotent, is right either way.
		s.log.Warn("ended lease's slot could not be verified; torn down as it is", "slot", i, "error", err)
	}
	// A change of the slot's policy under way ends before the slot does.
	unlock := s.lockPolicy(i)
	defer unlock()
	cp := s.table.copyOf(l)
	sl := cp.Slot
	s.withdraw(ctx, i, cp.Rec.LeaseID, cp.Rec.Ports)
	u, seen, err := s.usageNow(ctx, &cp)
	if err != nil {
		s.log.Warn("ended lease's counters are unreadable: its usage is what its earlier links counted", "slot", i, "error", err)
		u = cp.Rec.Ledger.Carried
	} else if seen.ifindex != 0 && seen != cp.seen {
		s.table.ended(l, seen)
	}
	control.Note(ctx, usageAttrs(u)...)
	switch {
	case sl == nil && s.keepHeld(ctx, i):
		// Lost at a restart, and something lives at its index: held.
		return u
	case sl == nil && cp.remains:
		// Lost while leased: what is left of its slot goes now.
		if err := s.pool.RetireLost(ctx, i); err != nil {
			s.log.Warn("remains of a lost lease's slot could not be torn down; the index stays quarantined for the reconciler", "slot", i, "error", err)
		}
		return u
	case sl == nil:
		if err := s.pool.PutLost(i); err != nil {
			s.log.Warn("index of a lost lease could not be freed", "slot", i, "error", err)
		}
		return u
	}
	if cp.Rec.Bandwidth != nil {
		// Its ifb outlives the slot's links: the teardown deletes it
		// too, off the answer's path when put answers first (a CNI DEL:
		// an ifb's deletion waits for the kernel's RCU grace periods,
		// tens of milliseconds).
		sl.Extra |= slot.HasShaper
	}
	if a := cp.Rec.Attachment; a != nil {
		// Cut off first, the pair's deletion left to the teardown, which
		// knows it by the slot's parked end; the container's namespace,
		// the runtime's, is never removed.
		if err := s.unplug(ctx, sl, a); err != nil {
			s.log.Warn("attachment could not be cut off; the teardown deletes its pair", "slot", i, "error", err)
		}
	}
	if err := put(ctx, sl); err != nil {
		s.log.Warn("released slot: teardown failed; the index stays quarantined for the reconciler", "slot", i, "error", err)
	}
	return u
}

// unplug cuts attachment a of slot sl off (slot.Manager.Unplug): in the
// container's namespace too if it is still the one recorded at its path.
func (s *Service) unplug(ctx context.Context, sl *slot.Slot, a *leases.Attachment) error {
	fd := -1
	if nfd, id, err := OpenNetns(a.NetnsPath); err == nil {
		defer unix.Close(nfd)
		if id == a.Netns {
			fd = nfd
		}
	}
	return s.mgr.Unplug(ctx, sl, fd, a.IfName)
}

// keepHeld keeps what is at the index of an ended lost lease when it is
// held (something lives in it): the index quarantined, not freed, and the
// slot recorded held, for the operator. It reports whether it was held.
func (s *Service) keepHeld(ctx context.Context, i int) bool {
	h, ok := s.held.Get(i)
	if !ok || !h.LostLease {
		return false
	}
	if err := s.pool.HoldLost(i); err != nil {
		s.log.Warn("lost lease's held index could not be quarantined", "slot", i, "error", err)
		return false
	}
	h.LostLease = false
	if err := s.records.Put(context.WithoutCancel(ctx), h.Record()); err != nil {
		s.log.Warn("held slot could not be recorded: it is kept until this daemon stops", "slot", i, "error", err)
	} else {
		h.Recorded = true
	}
	s.held.Put(h)
	s.log.Info("lost lease ended: what is at its index stays held", "slot", i)
	return true
}

// OpenNetns opens the network namespace at path (following it, as a
// runtime named it: netns.OpenForeign) and returns its descriptor and
// identity.
func OpenNetns(path string) (int, netns.ID, error) {
	fd, err := netns.OpenForeign(path)
	if err != nil {
		return -1, netns.ID{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, netns.ID{}, fmt.Errorf("fstat: %w", err)
	}
	return fd, netns.ID{Dev: st.Dev, Ino: st.Ino}, nil
}
