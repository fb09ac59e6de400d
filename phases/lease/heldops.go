package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// The operator's calls on the held slots (`phasegate held`): root's
// alone, which the route checks before it calls.

// HeldView is one held slot as the operator sees it: why it is held,
// what lives in it now, and whether its host link is there.
type HeldView struct {
	HeldSlot
	NetnsPath string `json:"netns_path"`
	// NetnsBound: the namespace held is still the one bound at NetnsPath.
	NetnsBound bool `json:"netns_bound"`
	HostLink   bool `json:"host_link"`
	// PIDs live in the namespace, or hold a descriptor on it, now.
	PIDs []int `json:"pids"`
}

// HeldViews describes every held slot, by index.
func (s *Service) HeldViews() ([]HeldView, error) {
	out := []HeldView{}
	held := s.held.List()
	if len(held) == 0 {
		return out, nil
	}
	live, err := netns.ScanLiveness()
	if err != nil {
		return out, Errorf(ErrInternal, "%v", err)
	}
	for _, h := range held {
		path := s.cfg.NetnsPath(h.Index)
		id, _ := netns.Stat(path)
		idx, _ := s.mgr.HostLinkIndex(h.Index)
		out = append(out, HeldView{HeldSlot: h, NetnsPath: path, NetnsBound: id == h.Netns, HostLink: idx != 0, PIDs: live.PIDs(h.Netns)})
	}
	return out, nil
}

// AdoptHeld makes the held slot at i a lease again for caller c, as req
// asks (its owner, request id and TTL; no policy, no attachment), as it
// is: nothing inside is touched; its host side is put back (the host link
// made again into the namespace if it was deleted, up, its address, its
// firewall element). The lease is recorded before the answer, as an
// Acquire's; the owner's client renews and releases it with its lease id.
// The answer's Repaired says what was put back.
func (s *Service) AdoptHeld(ctx context.Context, c control.Caller, i int, req Request) (Lease, error) {
	s.held.Ops.Lock()
	defer s.held.Ops.Unlock()
	h, err := s.heldAt(i)
	if err != nil {
		return Lease{}, err
	}
	if err := CheckNames(req.Owner, req.RequestID); err != nil {
		return Lease{}, err
	}
	if h.Index > s.cfg.Slots {
		return Lease{}, Errorf(ErrPrecondition, "slot %d is beyond --slots %d: release it, or run with more slots", h.Index, s.cfg.Slots)
	}
	control.Note(ctx, "slot", h.Index, "owner", req.Owner, "request_id", req.RequestID)
	sl, repaired, err := s.relinkHeld(ctx, h)
	if err != nil {
		return Lease{}, err
	}
	rec := newRecord(sl, req, c.Principal.String(), time.Now())
	rec.Ledger = s.startLedger(sl)
	if err := s.records.Put(ctx, rec); err != nil {
		var dup *leases.DuplicateRequestError
		if errors.As(err, &dup) {
			return Lease{}, Errorf(ErrExists, "request %q of owner %q holds slot %d already", req.RequestID, req.Owner, dup.Index)
		}
		return Lease{}, Errorf(ErrUnavailable, "record the lease: %v", err)
	}
	if err := s.pool.Adopt(sl); err != nil {
		return Lease{}, Errorf(ErrInternal, "slot %d: %v (its lease is recorded: the next start restores it)", h.Index, err)
	}
	s.table.add(&Lease{Rec: rec, Slot: sl})
	s.held.Remove(h.Index)
	s.log.Info("held slot adopted back as a lease", "slot", h.Index, "owner", names.Shown(req.Owner), "request_id", names.Shown(req.RequestID),
		"principal", rec.Principal, "netns_inode", sl.NetnsID.Ino, "repaired", fmt.Sprint(repaired))
	return Lease{Rec: rec, Slot: sl, Repaired: repaired}, nil
}

// heldAt returns the held slot at i, or why it cannot be acted on.
func (s *Service) heldAt(i int) (HeldSlot, error) {
	h, ok := s.held.Get(i)
	switch {
	case !ok:
		return h, Errorf(ErrNotFound, "slot %d is not held", i)
	case h.LostLease:
		return h, Errorf(ErrPrecondition, "slot %d is still the index of a lost lease (owner %s): it is acted on once that lease ends", i, names.Shown(h.Owner))
	}
	return h, nil
}

// relinkHeld returns held slot h as a slot, its host side put back, or why
// it cannot be: its namespace must still be the one held.
func (s *Service) relinkHeld(ctx context.Context, h HeldSlot) (*slot.Slot, []string, error) {
	sl := s.cfg.Slot(h.Index)
	sl.NetnsID = h.Netns
	if id, err := netns.Stat(sl.NetnsPath); err != nil || id != h.Netns {
		return nil, nil, Errorf(ErrPrecondition, "slot %d: the namespace held is no longer bound at %s: release it", h.Index, sl.NetnsPath)
	}
	idx, err := s.mgr.HostLinkIndex(h.Index)
	if err != nil {
		return nil, nil, Errorf(ErrInternal, "slot %d: %v", h.Index, err)
	}
	if idx == 0 {
		if err := s.mgr.RecreateHost(ctx, &sl); err != nil {
			return nil, nil, Errorf(ErrPrecondition, "slot %d: its host link is gone and cannot be made again: %v", h.Index, err)
		}
		return &sl, []string{"host link made again into its namespace"}, nil
	}
	sl.HostIfIndex = idx
	repaired, err := s.mgr.RepairHost(&sl)
	if err != nil {
		return nil, nil, Errorf(ErrPrecondition, "slot %d: its host link cannot be repaired: %v", h.Index, err)
	}
	if err := s.mgr.Firewall().Add(ctx, sl.HostIf); err != nil {
		return nil, nil, Errorf(ErrUnavailable, "slot %d: its firewall element: %v", h.Index, err)
	}
	return &sl, repaired, nil
}

// ReleaseHeld tears the held slot at i down, as a reclaim tears a leaked
// one down (the core's teardown options: the processes inside cut off
// with their namespace, or killed), and answers the teardown. Its index
// is free once it is gone.
func (s *Service) ReleaseHeld(ctx context.Context, i int) (*slot.TeardownResult, error) {
	s.held.Ops.Lock()
	defer s.held.Ops.Unlock()
	h, err := s.heldAt(i)
	if err != nil {
		return nil, err
	}
	control.Note(ctx, "slot", h.Index)
	res := s.mgr.Teardown(ctx, slot.Assume(h.Index), s.teardown)
	if s.tornDown != nil {
		s.tornDown(res)
	}
	if err := res.Err(); err != nil {
		return nil, Errorf(ErrUnavailable, "tear slot %d down: %v (it stays held)", h.Index, err)
	}
	if err := s.records.Remove(ctx, h.Index); err != nil {
		return nil, Errorf(ErrUnavailable, "delete its held record: %v (torn down; the next start finds nothing there)", err)
	}
	s.held.Remove(h.Index)
	if h.Index <= s.cfg.Slots {
		if err := s.pool.Free(h.Index); err != nil {
			s.log.Warn("released held slot's index could not be freed", "slot", h.Index, "error", err)
		}
	}
	s.log.Info("held slot released: torn down", "slot", h.Index, "orphans", len(res.Orphans), "kill_orphans", s.teardown.KillOrphans)
	return res, nil
}
