package lease

import (
	"context"
	"errors"
	"time"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/ports"
	"github.com/phasegate/phasegate/network/shape"
	"github.com/phasegate/phasegate/network/slot"
)

// Request is what an Acquire asks for: a slot for Owner, for request
// RequestID (none: "", not idempotent), held for TTL (0: until released),
// with egress policy Egress (nil: none) and bandwidth limits Bandwidth
// (from ParseBandwidth; nil: none), and for a CNI ADD the namespace the
// slot is attached to.
type Request struct {
	Owner     string
	RequestID string
	TTL       time.Duration
	Egress    *egress.Policy
	// Ports are the lease's published ports (ParsePorts), written before
	// its record.
	Ports []ports.Mapping
	// Bandwidth is the lease's limits (ParseBandwidth), set before its record.
	Bandwidth *shape.Limits
	// Attach, when not nil, attaches the slot (a CNI ADD: [Service.Attach]),
	// after its policy and before its record.
	Attach Target
}

// Target is where an ADD attaches its slot: the caller's namespace,
// entered and checked by the CNI adapter. The core calls it between the
// slot's policy and its record.
type Target interface {
	// Attach gives slot sl an inside end in the target namespace
	// (slot.Manager.Attach), answering what it made.
	Attach(ctx context.Context, m *slot.Manager, sl *slot.Slot) (*slot.Attachment, error)
	// Record is the attachment's part of the lease record.
	Record() *leases.Attachment
	// SameAs refuses a repeated ADD that names another namespace than the
	// one its key's slot is attached to, or a lease that is no attachment.
	SameAs(l Lease) error
}

// Acquired is Acquire's answer: the lease (a copy), and whether it existed
// already (a retry).
type Acquired struct {
	Lease Lease
	Retry bool
	// Made is what the Attach of a CNI ADD made; nil for a retry, and for
	// a lease of the Slots API.
	Made *slot.Attachment
}

// Acquire leases a slot to caller c as req asks (no attachment: the Slots
// API's Acquire), or answers the lease an earlier Acquire of the same
// request took. The names rule, the caller's grant and its rate are
// checked first.
func (s *Service) Acquire(ctx context.Context, c control.Caller, req Request) (Acquired, error) {
	if err := CheckNames(req.Owner, req.RequestID); err != nil {
		return Acquired{}, err
	}
	control.Note(ctx, "owner", req.Owner, "request_id", req.RequestID)
	if err := refuseCNIOwner(req.Owner); err != nil {
		return Acquired{}, err
	}
	if !c.Grant.MayLease(req.Owner) {
		return Acquired{}, Errorf(ErrDenied, "%s may not lease slots for owner %q (the control policy grants it no such owner)", c.Principal, req.Owner)
	}
	if err := control.Charge(ctx, EgressCost(req.Egress)); err != nil {
		return Acquired{}, err
	}
	req.Attach = nil
	var a Acquired
	var err error
	if req.RequestID == "" {
		a, err = s.acquire(ctx, c, req)
	} else {
		// Concurrent retries of one request wait for the first: they must
		// get its slot, not one each. The key holds the principal: a
		// retry by anyone else must not share the first call's answer.
		key := c.Principal.String() + "\x00" + req.Owner + "\x00" + req.RequestID
		var v any
		v, err, _ = s.acquiring.Do(key, func() (any, error) {
			a, err := s.acquire(ctx, c, req)
			return a, err
		})
		if err == nil {
			a = v.(Acquired)
		}
	}
	if err != nil {
		return Acquired{}, err
	}
	control.Note(ctx, "slot", a.Lease.Rec.Index, "retry", a.Retry)
	return a, nil
}

// Attach is the lease of a CNI ADD: a slot leased to caller c as req asks
// and attached to req.Attach, or the lease a first ADD of the key made
// (checked to be the same namespace's). The adapter checks the key, the
// caller's grant and its rate, and orders the ADDs of one key.
func (s *Service) Attach(ctx context.Context, c control.Caller, req Request) (Acquired, error) {
	return s.acquire(ctx, c, req)
}

// acquire leases a slot as req asks; req.Attach, when not nil, is where
// the slot is attached, after its record and before the reply.
func (s *Service) acquire(ctx context.Context, c control.Caller, req Request) (Acquired, error) {
	principal := c.Principal.String()
	if a, ok, err := s.retried(ctx, req.Owner, req.RequestID, principal); ok || err != nil {
		if err == nil && req.Attach != nil {
			err = req.Attach.SameAs(a.Lease)
		}
		return a, err
	}
	done, err := s.table.reserve(principal, c.Grant.MaxLeases)
	if err != nil {
		return Acquired{}, err
	}
	defer done()
	sl, err := s.takeSlot(ctx)
	if err != nil {
		return Acquired{}, err
	}
	// The policy before the record and the reply: a lease never runs
	// without the policy it was asked with.
	pol := req.Egress
	if pol != nil {
		if err := s.applyEgress(ctx, sl, pol); err != nil {
			s.returnUnleased(sl, true)
			return Acquired{}, egressError(sl.Index, err)
		}
	}
	// An attachment's pair is made before the record, which carries its
	// new host end's index. A start that finds it made and not recorded
	// finds the slot's host end not the one its idle record names, and
	// reclaims the slot, the container's end with it: the ADD that made
	// it never answered.
	var made *slot.Attachment
	var att *leases.Attachment
	if req.Attach != nil {
		if made, err = s.attach(ctx, sl, req.Attach, pol != nil); err != nil {
			return Acquired{}, err
		}
		att = req.Attach.Record()
	}
	// The limits on the host end the lease runs on (an attachment's is
	// made above), before the record and the reply, as the policy.
	bw := req.Bandwidth
	if bw != nil {
		if err := s.applyBandwidth(ctx, sl, bw); err != nil {
			s.dropUnleased(ctx, sl, made, pol != nil, true)
			return Acquired{}, bandwidthError(sl.Index, err)
		}
	}
	// The record after the attachment, whose new host end's index it
	// carries; the ports after it too: that end is the one the host's
	// connections to 127.0.0.1 leave by (route_localnet).
	rec := newRecord(sl, req, principal, time.Now())
	if err := s.publish(ctx, sl.Index, sl.HostIf, rec.LeaseID, portQuota{principal, c.Grant.MaxPorts}, nil, req.Ports); err != nil {
		s.dropUnleased(ctx, sl, made, pol != nil, bw != nil)
		return Acquired{}, err
	}
	rec.Egress, rec.Bandwidth, rec.Attachment, rec.Ledger, rec.Ports = pol, bw, att, s.startLedger(sl), req.Ports
	// The record first, the reply after: a lease the client hears of is a
	// lease a restart restores. If the record cannot be written, or the
	// caller left before it was, the slot goes back to the pool unused.
	if err := s.records.Put(ctx, rec); err != nil {
		s.withdraw(ctx, sl.Index, rec.LeaseID, req.Ports)
		s.dropUnleased(ctx, sl, made, pol != nil, bw != nil)
		return s.notRecorded(ctx, err, rec)
	}
	// Its link's reading at its start is the first of its traffic's.
	l := &Lease{Rec: rec, Slot: sl, seen: linkSeen{sl.HostIfIndex, rec.Ledger.Start}}
	s.table.add(l)
	s.count("acquired")
	s.log.Info("slot acquired", "slot", sl.Index, "owner", req.Owner, "request_id", req.RequestID, "principal", principal, "ttl", ttlShown(req.TTL))
	return Acquired{Lease: s.table.copyOf(l), Made: made}, nil
}

// newRecord is the record of slot sl leased at now to principal as req
// asks (its policy and attachment left to the caller).
func newRecord(sl *slot.Slot, req Request, principal string, now time.Time) leases.Record {
	rec := leases.Record{
		Index: sl.Index, State: leases.Leased,
		Owner: req.Owner, LeaseID: leases.NewLeaseID(), RequestID: req.RequestID, Principal: principal,
		Acquired: now, TTL: req.TTL,
		Netns: sl.NetnsID, HostIfindex: sl.HostIfIndex, Created: now,
	}
	if req.TTL > 0 {
		rec.Expires = now.Add(req.TTL)
	}
	return rec
}

// notRecorded answers an Acquire whose lease rec could not be recorded
// (its slot given back already): with the lease a retry on another
// daemon image's connection won the race with, or the error.
func (s *Service) notRecorded(ctx context.Context, err error, rec leases.Record) (Acquired, error) {
	var dup *leases.DuplicateRequestError
	switch {
	case errors.As(err, &dup):
		if l, ok := s.table.byRequest(rec.Owner, rec.RequestID); ok {
			cp := s.table.copyOf(l)
			if err := retriedBy(cp, rec.Principal); err != nil {
				return Acquired{}, err
			}
			return Acquired{Lease: cp, Retry: true}, nil
		}
		return Acquired{}, Errorf(ErrAborted, "request %q of %q is being served: retry", rec.RequestID, rec.Owner)
	case errors.Is(err, leases.ErrNoSpace):
		s.log.Error("lease not recorded: the state filesystem is full; nothing handed out", "slot", rec.Index, "owner", rec.Owner, "error", err)
		return Acquired{}, wrapError(ErrExhausted, err, "cannot record the lease: the daemon's state filesystem is full")
	case ctx.Err() != nil:
		return Acquired{}, FromContext(ctx.Err())
	}
	return Acquired{}, Errorf(ErrInternal, "record the lease: %v", err)
}

// retried answers an Acquire whose request an earlier one took a lease
// for (ok), with that lease once it is settled.
func (s *Service) retried(ctx context.Context, owner, requestID, principal string) (a Acquired, ok bool, err error) {
	if requestID == "" {
		return Acquired{}, false, nil
	}
	l, ok := s.table.byRequest(owner, requestID)
	if !ok {
		return Acquired{}, false, nil
	}
	if err := retriedBy(s.table.copyOf(l), principal); err != nil {
		return Acquired{}, true, err
	}
	// The retry's answer says ACQUIRED or LOST, never "not checked yet":
	// a client acts on it.
	if err := s.Settle(ctx, l); err != nil {
		return Acquired{}, true, err
	}
	s.log.Info("slot acquire retried: same lease", "slot", s.table.copyOf(l).Rec.Index, "owner", owner, "request_id", requestID)
	return Acquired{Lease: s.table.copyOf(l), Retry: true}, true, nil
}

// retriedBy refuses a retried Acquire whose caller is not the principal
// that took the lease: the lease id goes only to its principal.
func retriedBy(l Lease, principal string) error {
	if l.Rec.Principal == principal {
		return nil
	}
	return Errorf(ErrExists, "request %q of owner %q was made by another principal: its lease is not yours (choose another request id)",
		l.Rec.RequestID, l.Rec.Owner)
}

// attach gives slot sl an inside end in target to. If that fails, the
// slot goes back to the pool: warm as it was when Attach refused before
// touching it, torn down and made again otherwise. hadPolicy says an
// egress policy was written for the lease. The error wraps the
// manager's (slot.ErrIfNameTaken, slot.ErrNotAttachable), for the
// adapter's codes.
func (s *Service) attach(ctx context.Context, sl *slot.Slot, to Target, hadPolicy bool) (*slot.Attachment, error) {
	made, err := to.Attach(ctx, s.mgr, sl)
	if err == nil {
		return made, nil
	}
	untouched := errors.Is(err, slot.ErrIfNameTaken) || errors.Is(err, slot.ErrNotAttachable)
	if untouched {
		s.returnUnleased(sl, hadPolicy)
	} else if perr := s.pool.Put(context.WithoutCancel(ctx), sl); perr != nil {
		s.log.Warn("slot of a failed attach could not be made again", "slot", sl.Index, "error", perr)
	}
	switch {
	case errors.Is(err, slot.ErrIfNameTaken):
		return nil, wrapError(ErrExists, err, err.Error())
	case errors.Is(err, slot.ErrNotAttachable):
		return nil, wrapError(ErrDenied, err, err.Error())
	case ctx.Err() != nil:
		return nil, FromContext(ctx.Err())
	}
	return nil, wrapError(ErrInternal, err, err.Error())
}

// unattach undoes an attachment whose lease could not be recorded: the
// new pair deleted (the container's end with it), and the slot torn down
// and made again.
func (s *Service) unattach(ctx context.Context, sl *slot.Slot) {
	bg := context.WithoutCancel(ctx)
	if err := s.mgr.Detach(bg, sl); err != nil {
		s.log.Warn("attachment not recorded could not be undone", "slot", sl.Index, "error", err)
	}
	if err := s.pool.Put(bg, sl); err != nil {
		s.log.Warn("slot of an attachment not recorded could not be made again", "slot", sl.Index, "error", err)
	}
}

// ttlShown is a lease's TTL as logged: "none" for a lease held until
// released, which "0s" would read as one that expires at once.
func ttlShown(ttl time.Duration) string {
	if ttl <= 0 {
		return "none"
	}
	return ttl.String()
}
