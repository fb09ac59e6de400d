package lease

import (
	"context"
	"errors"
	"net/netip"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/ports"
)

// The published ports of the leases (package network/ports): claimed in
// the core's Owners (the one owner of the host ports), written into the
// slot table's maps, recorded with the lease. portsMu orders each claim
// with its elements' write, and a reconcile's Sync against both, so that
// a Sync never takes an element a call is about to record, nor puts back
// one a call withdrew.

// ParsePorts reads a request's published ports (the Slots API's proto, the
// CNI wire's, each a ports.Message): a port outside 1-65535, an unknown
// protocol, two mappings of one host port, a host address that is not
// IPv4, are refused as ErrInvalid.
func ParsePorts[M ports.Message](ms []M) ([]ports.Mapping, error) {
	out, err := ports.FromMessages(ms)
	if err != nil {
		return nil, wrapError(ErrInvalid, err, err.Error())
	}
	return out, nil
}

// slotAddr is the inside address of slot i, where its mappings lead.
func (s *Service) slotAddr(i int) netip.Addr {
	_, in := s.cfg.Addrs(i)
	return in.Addr()
}

// portQuota is the principal a lease's published ports are counted
// against, and how many host ports that principal's leases may publish
// at once (the caller's control.Grant.MaxPorts; 0: no limit).
type portQuota struct {
	principal string
	max       int
}

// checkPortQuota refuses ms in place of old for lease leaseID when, with
// what q's principal's other leases publish, they would take more than
// q.max host ports; a change that adds none is never refused. portsMu is
// held.
func (s *Service) checkPortQuota(q portQuota, leaseID string, old, ms []ports.Mapping) error {
	if q.max <= 0 || len(ms) <= len(old) {
		return nil
	}
	n := len(ms)
	for id, p := range s.portsBy {
		if p == q.principal && id != leaseID {
			n += len(s.owners.Of(id))
		}
	}
	if n > q.max {
		return Errorf(ErrExhausted, "%s's leases would publish %d host ports, its quota is %d (max_ports in the control policy; unless it says, %d): withdraw some first",
			q.principal, n, q.max, control.DefaultMaxPorts)
	}
	return nil
}

// publish makes ms the published ports of lease leaseID of slot i, whose
// host end is hostIf, in place of old: counted against q, claimed, then
// written. A refusal changes nothing.
func (s *Service) publish(ctx context.Context, i int, hostIf, leaseID string, q portQuota, old, ms []ports.Mapping) error {
	if len(old) == 0 && len(ms) == 0 {
		return nil
	}
	s.portsMu.Lock()
	defer s.portsMu.Unlock()
	if err := s.checkPortQuota(q, leaseID, old, ms); err != nil {
		return err
	}
	to := s.slotAddr(i)
	if err := s.owners.Claim(leaseID, to, ms); err != nil {
		return portsError(i, err)
	}
	pt := s.mgr.Ports()
	if err := pt.Set(context.WithoutCancel(ctx), hostIf, to, old, ms); err != nil {
		s.owners.Load(leaseID, to, old)
		if perr := pt.Set(context.WithoutCancel(ctx), hostIf, to, ms, old); perr != nil {
			s.log.Warn("published ports: a change failed and the old mappings could not be put back; the reconciler does", "slot", i, "error", perr)
		}
		return portsError(i, err)
	}
	s.portsBy[leaseID] = q.principal
	if len(ms) == 0 {
		delete(s.portsBy, leaseID)
	}
	return nil
}

// withdraw takes lease leaseID's published ports old off slot i (whose
// host end is going, or gone: its route_localnet is left alone) and frees
// its host ports. An element that cannot be removed is left to the
// reconciler's Sync, which removes what no lease holds.
func (s *Service) withdraw(ctx context.Context, i int, leaseID string, old []ports.Mapping) {
	if len(old) == 0 {
		return
	}
	s.portsMu.Lock()
	defer s.portsMu.Unlock()
	s.owners.Drop(leaseID)
	delete(s.portsBy, leaseID)
	if err := s.mgr.Ports().Set(context.WithoutCancel(ctx), "", s.slotAddr(i), old, nil); err != nil {
		s.log.Warn("published ports of an ended lease could not be withdrawn; the reconciler does", "slot", i, "error", err)
	}
}

// portsError maps a refused claim or a failed write: bad input is
// ErrInvalid, a host port another lease publishes ErrExists, one the host
// has bound (or a host address not the host's) ErrPrecondition.
func portsError(i int, err error) error {
	switch {
	case errors.Is(err, ports.ErrInvalid):
		return wrapError(ErrInvalid, err, err.Error())
	case errors.Is(err, ports.ErrTaken):
		return wrapError(ErrExists, err, err.Error())
	case errors.Is(err, ports.ErrBound), errors.Is(err, ports.ErrNotHost):
		return wrapError(ErrPrecondition, err, err.Error())
	}
	return Errorf(ErrInternal, "slot %d: write the published ports: %v", i, err)
}

// SetPorts replaces the published ports of slot i's lease, whose id is
// leaseID, for caller c, and answers the lease: authorized as SetEgress,
// the new mappings claimed and their elements written in one transaction
// with the old ones' removal, then the record; a record that cannot be
// written puts the old mappings back.
func (s *Service) SetPorts(ctx context.Context, c control.Caller, i int, leaseID string, ms []ports.Mapping) (Lease, error) {
	if err := s.leaseCall(ctx, c, i, leaseID); err != nil {
		return Lease{}, err
	}
	if err := ports.ValidateList(ms); err != nil {
		return Lease{}, wrapError(ErrInvalid, err, err.Error())
	}
	cur, unlock, err := s.changedLease(ctx, i, leaseID, "publish ports of")
	defer unlock()
	if err != nil {
		return Lease{}, err
	}
	old, sl := cur.Rec.Ports, cur.Slot
	if err := s.publish(ctx, i, sl.HostIf, leaseID, portQuota{cur.Rec.Principal, c.Grant.MaxPorts}, old, ms); err != nil {
		return Lease{}, err
	}
	rec, err := s.updateLease(ctx, i, leaseID, func(r *leases.Record) { r.Ports = ms })
	if err != nil {
		// The record keeps the old mappings: so must the table.
		if perr := s.publish(ctx, i, sl.HostIf, leaseID, portQuota{principal: cur.Rec.Principal}, ms, old); perr != nil {
			s.log.Error("published ports: a change was not recorded and the recorded mappings could not be put back", "slot", i, "error", perr)
		}
		return Lease{}, leaseError(i, err)
	}
	s.table.setRecordOf(rec)
	s.count("ports_set")
	s.log.Info("published ports set", "slot", i, "owner", names.Shown(rec.Owner), "principal", c.Principal.String(), "ports", len(ms))
	return Lease{Rec: rec, Slot: sl}, nil
}

// SyncPorts makes the slot table's maps hold exactly the leases' published
// ports (a reconcile pass: an element deleted from outside put back, one
// no lease holds removed), answering how many of each.
func (s *Service) SyncPorts(ctx context.Context) (added, removed int, err error) {
	s.portsMu.Lock()
	defer s.portsMu.Unlock()
	return s.mgr.Ports().Sync(ctx, s.owners.Entries(), nil)
}

// portsRelinked writes the published ports ms of slot i again once its
// host end hostIf was made again (relink): the elements are the same, but
// a new link does not route 127/8 (route_localnet), which the host's own
// connections to 127.0.0.1:<host port> need.
func (s *Service) portsRelinked(ctx context.Context, i int, hostIf string, ms []ports.Mapping) {
	if len(ms) == 0 {
		return
	}
	s.portsMu.Lock()
	defer s.portsMu.Unlock()
	if err := s.mgr.Ports().Set(context.WithoutCancel(ctx), hostIf, s.slotAddr(i), ms, ms); err != nil {
		s.log.Warn("published ports: the slot's host link was made again and its ports could not be written again; the host's connections to 127.0.0.1 fail until the lease's next SetPorts", "slot", i, "error", err)
	}
}

// loadPorts claims the published ports of the leases restored at a start
// (their elements are in the kernel already).
func (s *Service) loadPorts() {
	for _, l := range s.table.copies() {
		s.owners.Load(l.Rec.LeaseID, s.slotAddr(l.Rec.Index), l.Rec.Ports)
		if len(l.Rec.Ports) > 0 {
			s.portsBy[l.Rec.LeaseID] = l.Rec.Principal
		}
	}
}
