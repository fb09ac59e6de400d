package phases

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
)

// slotsServiceName is the Slots API's full gRPC name.
const slotsServiceName = "phasegate.v1.Slots"

func slotsServiceDesc() *grpc.ServiceDesc { return &phasegatev1.Slots_ServiceDesc }

// lease is a slot leased to an owner, as recorded. A lost lease has no
// slot: its objects were gone when the daemon restarted. A lease restored
// at a start has a check until its slot's kernel identity is verified
// (the daemon serves before that): its slot is then what the record says
// it is, and its index is the lease's whatever the check finds.
type lease struct {
	rec        leases.Record
	slot       *slot.Slot
	lostReason string
	check      *leaseCheck // nil once verified
	// deferred: past its deadline, its expiry was deferred because the
	// daemon was impaired (expiry.go); logged once until it is renewed.
	deferred bool
	// remains: lost while held (broken from outside, broken.go), with
	// what is left of its slot kept until the lease ends, which tears it
	// down. repaired: what was put back of its slot while held, shown by
	// Get and List.
	remains  bool
	repaired []string
}

// slotsService implements phasegate.v1.Slots over the pool (which owns the
// slot indices) and the durable records. Every lease is recorded before Acquire replies;
// Release and KeepAlive compare the lease id in the same transaction that
// changes the record.
//
// Every call is authorized against its caller ([control.CallerFrom], put
// there by the control surface's guard): a call without one is refused.
// A lease is bound to the principal that took it.
type slotsService struct {
	phasegatev1.UnimplementedSlotsServer

	cfg     slot.Config
	pool    *pool.Pool
	mgr     *slot.Manager // writes the leases' egress policies
	records *slotRecords
	log     *slog.Logger
	audit   *slog.Logger // log with audit=true: what happened to a lease but a call
	breaks  *breaks      // leases found broken from outside (broken.go)
	tracer  trace.Tracer
	events  leaseEvents
	// restore checks the leases restored unverified; nil when none was
	// (NewSlotsServer).
	restore *restoreCheck

	acquiring singleflight.Group // one Acquire per owner and request id at a time

	// impaired says when the daemon last could not take the calls of a
	// lease's principal; nil: never (expiry.go).
	impaired impairment
	stalled  atomic.Int64 // Unix ns when the expiry loop last ran late

	egress egress.Defaults // the daemon's part of every egress policy (the manager's)
	// policyMu holds one lock per slot index for the slot's egress
	// policy: one change at a time per slot, and a lease's end waits for
	// a change under way, so that no policy is written for a slot being
	// torn down (slot.Manager.ApplyEgress). Policies of different slots
	// are written at once.
	policyMu []sync.Mutex

	// table holds the leases; its mutex guards them (leasetable.go).
	table *leaseTable

	// held are the daemon's held slots: a lost lease's index held keeps
	// what is there when the lease ends (nil: none is ever held).
	held *heldSlots
}

// LeaseStore is what the Slots service needs of the durable records: the
// methods of *leases.Store it calls, with their contracts (Put refuses a
// request another slot's lease holds with *leases.DuplicateRequestError,
// and a full filesystem with leases.ErrNoSpace; Update refuses a missing
// record with leases.ErrNotFound, and deletes it when fn returns
// leases.ErrRemove; Delete deletes the records of the indices given, in
// one transaction, and ignores those with none). A retried Acquire is
// found in the service's own leases, not in the store.
//
// It is exported, with [NewSlotsServer], for the benchmark alone
// (test/bench): its in-memory baseline is this service over a store in a
// map, so that the comparison measures the durable record and nothing else.
type LeaseStore interface {
	Put(ctx context.Context, recs ...leases.Record) error
	Update(ctx context.Context, index int, fn func(*leases.Record) error) (leases.Record, error)
	Delete(ctx context.Context, indices ...int) error
}

var _ LeaseStore = (*leases.Store)(nil)

// NewSlotsServer returns the daemon's Slots service over pl, which owns
// the slot indices and makes its slots with m, and store, with no lease
// restored, no expiry loop, no tracing and no metrics; the egress policies'
// defaults are m's. Its calls must come through a [control.Guard]
// (the service authorizes the caller the guard names, and refuses a call
// without one). The daemon builds its own service; this exists so that the
// benchmark's in-memory baseline serves the same code (see [LeaseStore]).
// A nil log discards the service's lines.
func NewSlotsServer(m *slot.Manager, pl *pool.Pool, store LeaseStore, log *slog.Logger) phasegatev1.SlotsServer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return newSlotsService(m, pl, newSlotRecords(store, log), newLeaseTable(nil), log, noop.NewTracerProvider().Tracer(""), nil, nil)
}

// leaseEvents counts what happens to leases (the daemon's metrics); nil
// functions count nothing.
type leaseEvents func(event string, n int)

// newSlotsService returns the service over table's leases; restore, when
// a start restored leases, checks them.
func newSlotsService(m *slot.Manager, pl *pool.Pool, records *slotRecords, table *leaseTable,
	log *slog.Logger, tracer trace.Tracer, events leaseEvents, restore *restoreCheck) *slotsService {
	cfg := m.Config()
	return &slotsService{cfg: cfg, pool: pl, mgr: m, records: records, log: log, audit: log.With("audit", true), breaks: &breaks{},
		tracer: tracer, events: events, restore: restore,
		egress: m.EgressDefaults(), policyMu: make([]sync.Mutex, cfg.Slots+1), table: table}
}

// settle waits until restored lease l is verified, if it is one (see
// restoreCheck.settle).
func (s *slotsService) settle(ctx context.Context, l *lease) error {
	if s.restore == nil {
		return nil // no lease was restored: none waits for a check
	}
	return s.restore.settle(ctx, l)
}

func (s *slotsService) count(event string) {
	if s.events != nil {
		s.events(event, 1)
	}
}

// checkNames refuses an Acquire whose owner or request id (when given)
// breaks the names rule (internal/names): a name that could look like
// another's is never leased. A name recorded before the rule is not
// checked again: its lease keeps working by index and lease id. (A CNI
// network's owner is refused whatever its request id, refuseCNIOwner: an
// attachment's key is checked by the ADD that alone makes one.)
func checkNames(owner, requestID string) error {
	err := names.Check("owner", owner)
	if err == nil && requestID != "" {
		err = names.Check("request_id", requestID)
	}
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return nil
}

// checkIndex maps an index to a gRPC status error: 0 is not an index at all,
// one beyond --slots is one this daemon does not have.
func (s *slotsService) checkIndex(i uint32) error {
	switch {
	case i == 0:
		return status.Error(codes.InvalidArgument, "index is required (slots are numbered from 1)")
	case int64(i) > int64(s.cfg.Slots):
		return status.Errorf(codes.NotFound, "slot %d does not exist (slots are 1..%d)", i, s.cfg.Slots)
	}
	return nil
}

// callerOf returns who makes the call. The control surface's guard puts
// the caller in every call it admits; a call without one came some other
// way and is refused.
func callerOf(ctx context.Context) (control.Caller, error) {
	c, ok := control.CallerFrom(ctx)
	if !ok {
		return control.Caller{}, status.Error(codes.Unauthenticated, "the Slots API is served only on the control surface")
	}
	return c, nil
}

// sameLease compares lease ids in constant time: a lease id is a
// capability, and the time a comparison takes must not tell how much of a
// guess was right.
func sameLease(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// acquired is Acquire's answer: the lease, and whether it existed already
// (a retry).
type acquired struct {
	l     *lease
	retry bool
	// made is what the Attach of a CNI ADD made; nil for a retry, and for
	// a lease of the Slots API.
	made *slot.Attachment
}

// Acquire implements phasegate.v1.Slots.
func (s *slotsService) Acquire(ctx context.Context, req *phasegatev1.AcquireRequest) (*phasegatev1.AcquireResponse, error) {
	if err := checkNames(req.GetOwner(), req.GetRequestId()); err != nil {
		return nil, err
	}
	// A TTL that is set must be positive: a client's arithmetic gone
	// wrong (a negative or zero TTL) must not be taken for "held until
	// released", which only an unset TTL asks for.
	ttl := req.GetTtl().AsDuration()
	if req.GetTtl() != nil && (!req.GetTtl().IsValid() || ttl <= 0) {
		return nil, status.Errorf(codes.InvalidArgument, "ttl %v: must be a positive duration (leave it unset for a lease held until released)", req.GetTtl().AsDuration())
	}
	pol, err := parseEgress(req.GetEgressPolicy(), s.egress)
	if err != nil {
		return nil, err
	}
	c, err := callerOf(ctx)
	if err != nil {
		return nil, err
	}
	owner := req.GetOwner()
	control.Note(ctx, "owner", owner, "request_id", req.GetRequestId())
	if err := refuseCNIOwner(owner); err != nil {
		return nil, err
	}
	if !c.Grant.MayLease(owner) {
		return nil, status.Errorf(codes.PermissionDenied, "%s may not lease slots for owner %q (the control policy grants it no such owner)", c.Principal, owner)
	}
	if err := control.Charge(ctx, egressCost(pol)); err != nil {
		return nil, err
	}
	var a acquired
	if req.GetRequestId() == "" {
		a, err = s.acquire(ctx, c, owner, "", ttl, pol, nil)
	} else {
		// Concurrent retries of one request wait for the first: they must
		// get its slot, not one each. The key holds the principal: a
		// retry by anyone else must not share the first call's answer.
		key := c.Principal.String() + "\x00" + owner + "\x00" + req.GetRequestId()
		var v any
		v, err, _ = s.acquiring.Do(key, func() (any, error) {
			a, err := s.acquire(ctx, c, owner, req.GetRequestId(), ttl, pol, nil)
			return a, err
		})
		if err == nil {
			a = v.(acquired)
		}
	}
	if err != nil {
		return nil, err
	}
	l := s.table.copyOf(a.l)
	control.Note(ctx, "slot", l.rec.Index, "retry", a.retry)
	return &phasegatev1.AcquireResponse{Slot: s.describe(l.rec.Index, leaseState(&l), &l, c), LeaseId: l.rec.LeaseID}, nil
}

// acquire leases a slot to owner for request requestID (none: ""), with
// egress policy pol (nil: none); to, when not nil, is the namespace the
// slot is attached to (a CNI ADD), after its record and before the reply.
func (s *slotsService) acquire(ctx context.Context, c control.Caller, owner, requestID string, ttl time.Duration, pol *egress.Policy, to *attachTarget) (acquired, error) {
	principal := c.Principal.String()
	if a, ok, err := s.retried(ctx, owner, requestID, principal); ok || err != nil {
		if err == nil && to != nil {
			err = to.sameAs(s.table.copyOf(a.l))
		}
		return a, err
	}
	done, err := s.table.reserve(principal, c.Grant.MaxLeases)
	if err != nil {
		return acquired{}, err
	}
	defer done()
	sl, err := s.takeSlot(ctx)
	if err != nil {
		return acquired{}, err
	}
	// The policy before the record and the reply: a lease never runs
	// without the policy it was asked with.
	if pol != nil {
		if err := s.applyEgress(ctx, sl, pol); err != nil {
			s.returnUnleased(sl, true)
			return acquired{}, egressError(sl.Index, err)
		}
	}
	// An attachment's pair is made before the record, which carries its
	// new host end's index. A start that finds it made and not recorded
	// finds the slot's host end not the one its idle record names, and
	// reclaims the slot, the container's end with it: the ADD that made
	// it never answered.
	var made *slot.Attachment
	if to != nil {
		if made, err = s.attach(ctx, sl, to, pol != nil); err != nil {
			return acquired{}, err
		}
	}
	now := time.Now()
	rec := leases.Record{
		Index: sl.Index, State: leases.Leased,
		Owner: owner, LeaseID: leases.NewLeaseID(), RequestID: requestID, Principal: principal,
		Acquired: now, TTL: ttl,
		Netns: sl.NetnsID, HostIfindex: sl.HostIfIndex, Created: now,
		Egress: pol, Attachment: to.record(),
	}
	if ttl > 0 {
		rec.Expires = now.Add(ttl)
	}
	// The record first, the reply after: a lease the client hears of is a
	// lease a restart restores. If the record cannot be written, or the
	// caller left before it was, the slot goes back to the pool unused.
	if err := s.records.put(ctx, rec); err != nil {
		if made != nil {
			s.unattach(ctx, sl)
		} else {
			s.returnUnleased(sl, pol != nil)
		}
		return s.notRecorded(ctx, err, rec)
	}
	l := &lease{rec: rec, slot: sl}
	s.table.add(l)
	s.count("acquired")
	s.log.Info("slot acquired", "slot", sl.Index, "owner", owner, "request_id", requestID, "principal", principal, "ttl", ttl.String())
	return acquired{l: l, made: made}, nil
}

// notRecorded answers an Acquire whose lease rec could not be recorded
// (its slot given back already): with the lease a retry on another
// daemon image's connection won the race with, or the error.
func (s *slotsService) notRecorded(ctx context.Context, err error, rec leases.Record) (acquired, error) {
	var dup *leases.DuplicateRequestError
	switch {
	case errors.As(err, &dup):
		if l, ok := s.table.byRequest(rec.Owner, rec.RequestID); ok {
			if err := retriedBy(s.table.copyOf(l), rec.Principal); err != nil {
				return acquired{}, err
			}
			return acquired{l: l, retry: true}, nil
		}
		return acquired{}, status.Errorf(codes.Aborted, "request %q of %q is being served: retry", rec.RequestID, rec.Owner)
	case errors.Is(err, leases.ErrNoSpace):
		s.log.Error("lease not recorded: the state filesystem is full; nothing handed out", "slot", rec.Index, "owner", rec.Owner, "error", err)
		return acquired{}, status.Errorf(codes.ResourceExhausted, "cannot record the lease: the daemon's state filesystem is full")
	case ctx.Err() != nil:
		return acquired{}, status.FromContextError(ctx.Err()).Err()
	}
	return acquired{}, status.Errorf(codes.Internal, "record the lease: %v", err)
}

// retried answers an Acquire whose request an earlier one took a lease
// for (ok), with that lease once it is settled.
func (s *slotsService) retried(ctx context.Context, owner, requestID, principal string) (a acquired, ok bool, err error) {
	if requestID == "" {
		return acquired{}, false, nil
	}
	l, ok := s.table.byRequest(owner, requestID)
	if !ok {
		return acquired{}, false, nil
	}
	if err := retriedBy(s.table.copyOf(l), principal); err != nil {
		return acquired{}, true, err
	}
	// The retry's answer says ACQUIRED or LOST, never "not checked yet":
	// a client acts on it.
	if err := s.settle(ctx, l); err != nil {
		return acquired{}, true, err
	}
	s.log.Info("slot acquire retried: same lease", "slot", l.rec.Index, "owner", owner, "request_id", requestID)
	return acquired{l: l, retry: true}, true, nil
}

// retriedBy refuses a retried Acquire whose caller is not the principal
// that took the lease: the lease id goes only to its principal.
func retriedBy(l lease, principal string) error {
	if l.rec.Principal == principal {
		return nil
	}
	return status.Errorf(codes.AlreadyExists, "request %q of owner %q was made by another principal: its lease is not yours (choose another request id)",
		l.rec.RequestID, l.rec.Owner)
}

// errWrongLease refuses a lease id that is not the slot's lease.
var errWrongLease = errors.New("wrong lease id")

// endLease removes the slot's lease record if leaseID is its lease (any
// lease when leaseID is ""), and forgets the lease. The caller gives the
// slot back.
func (s *slotsService) endLease(ctx context.Context, i int, leaseID string) (*lease, error) {
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

// leaseError maps a lease check to the status Release and KeepAlive answer.
func leaseError(i int, err error) error {
	switch {
	case errors.Is(err, leases.ErrNotFound):
		return status.Errorf(codes.FailedPrecondition, "slot %d is not leased", i)
	case errors.Is(err, errWrongLease):
		return status.Errorf(codes.PermissionDenied, "slot %d: lease_id is not this slot's lease", i)
	case errors.Is(err, leases.ErrNoSpace):
		return status.Errorf(codes.ResourceExhausted, "slot %d: cannot record the change: the daemon's state filesystem is full", i)
	}
	return status.Errorf(codes.Internal, "slot %d: %v", i, err)
}

// mayChange refuses a Release or KeepAlive of slot i by a caller that is
// neither the principal of its lease nor one the policy lets act for the
// lease's owner. A slot that is not leased is left for the lease check to
// answer, the same for every caller.
func (s *slotsService) mayChange(ctx context.Context, c control.Caller, i int) error {
	l := s.table.copyAt(i)
	if l == nil {
		return nil
	}
	control.Note(ctx, "owner", names.Shown(l.rec.Owner))
	if mayAct(c, l.rec) {
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "slot %d: %s may not act for the owner of its lease", i, c.Principal)
}

// mayAct reports whether caller c may change lease rec: it is the lease's
// principal, or one the policy lets act for its owner. A CNI attachment
// is its principal's and root's alone: neither leasing its network's
// owner nor attach for it is enough (cnikeys.go).
func mayAct(c control.Caller, rec leases.Record) bool {
	switch {
	case rec.Principal == c.Principal.String():
		return true
	case rec.Attachment != nil:
		return c.Principal.IsRoot()
	}
	return c.Grant.MayLease(rec.Owner)
}

// leaseCall is the opening of every call on a lease (Release,
// KeepAlive, SetEgressPolicy): the caller identified, the index in range
// and noted for the audit line, a lease id given, and the caller allowed
// to act for the lease's owner. The lease id itself is compared where the
// record is read.
func (s *slotsService) leaseCall(ctx context.Context, index uint32, leaseID string) (control.Caller, int, error) {
	c, err := callerOf(ctx)
	if err != nil {
		return control.Caller{}, 0, err
	}
	if err := s.checkIndex(index); err != nil {
		return control.Caller{}, 0, err
	}
	i := int(index)
	control.Note(ctx, "slot", i)
	if leaseID == "" {
		return control.Caller{}, 0, status.Errorf(codes.PermissionDenied, "slot %d: lease_id is required", i)
	}
	if err := s.mayChange(ctx, c, i); err != nil {
		return control.Caller{}, 0, err
	}
	return c, i, nil
}

// Release implements phasegate.v1.Slots.
func (s *slotsService) Release(ctx context.Context, req *phasegatev1.ReleaseRequest) (*phasegatev1.ReleaseResponse, error) {
	c, i, err := s.leaseCall(ctx, req.GetIndex(), req.GetLeaseId())
	if err != nil {
		return nil, err
	}
	l, err := s.endLease(ctx, i, req.GetLeaseId())
	if err != nil {
		return nil, leaseError(i, err)
	}
	s.giveBack(context.WithoutCancel(ctx), l)
	s.count("released")
	s.log.Info("slot released", "slot", i, "owner", names.Shown(l.rec.Owner), "principal", c.Principal.String(), "held", time.Since(l.rec.Acquired).Round(time.Millisecond).String())
	return &phasegatev1.ReleaseResponse{}, nil
}

// KeepAlive implements phasegate.v1.Slots.
func (s *slotsService) KeepAlive(ctx context.Context, req *phasegatev1.KeepAliveRequest) (*phasegatev1.KeepAliveResponse, error) {
	_, i, err := s.leaseCall(ctx, req.GetIndex(), req.GetLeaseId())
	if err != nil {
		return nil, err
	}
	now := time.Now()
	rec, err := s.records.update(ctx, i, func(r *leases.Record) error {
		if r.State != leases.Leased {
			return leases.ErrNotFound
		}
		if !sameLease(r.LeaseID, req.GetLeaseId()) {
			return errWrongLease
		}
		if r.TTL > 0 {
			r.Expires = now.Add(r.TTL)
		}
		return nil
	})
	if err != nil {
		return nil, leaseError(i, err)
	}
	s.table.setRecord(i, rec)
	resp := &phasegatev1.KeepAliveResponse{Ttl: durationpb.New(rec.TTL)}
	if !rec.Expires.IsZero() {
		resp.ExpiresAt = timestamppb.New(rec.Expires)
	}
	return resp, nil
}

// Get implements phasegate.v1.Slots.
func (s *slotsService) Get(ctx context.Context, req *phasegatev1.GetRequest) (*phasegatev1.GetResponse, error) {
	c, err := callerOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.checkIndex(req.GetIndex()); err != nil {
		return nil, err
	}
	st, held := s.view().at(int(req.GetIndex()))
	if held != nil && !c.Grant.MayRead(held.rec.Owner) {
		return nil, status.Errorf(codes.PermissionDenied, "slot %d is leased to an owner %s may not see", req.GetIndex(), c.Principal)
	}
	sl := s.describe(int(req.GetIndex()), st, held, c)
	l := s.table.copyAt(int(req.GetIndex()))
	if l != nil && s.hasInside(l) {
		// What the slot's root changed is seen here, and put back.
		repaired, err := s.repairLease(ctx, l.rec.Index, l.rec.LeaseID)
		if err != nil {
			s.log.Warn("get: the slot could not be verified", "slot", l.rec.Index, "error", err)
		} else if len(repaired) > 0 {
			s.log.Warn("lease: inside of its slot repaired", "slot", l.rec.Index, "owner", names.Shown(l.rec.Owner), "repaired", strings.Join(repaired, ", "), "by", "get")
		}
		sl.Repaired = append(sl.Repaired, repaired...)
		sl.EgressDroppedPackets = s.egressDrops(ctx, l)
	}
	return &phasegatev1.GetResponse{Slot: sl}, nil
}

// List implements phasegate.v1.Slots.
func (s *slotsService) List(ctx context.Context, req *phasegatev1.ListRequest) (*phasegatev1.ListResponse, error) {
	c, err := callerOf(ctx)
	if err != nil {
		return nil, err
	}
	return &phasegatev1.ListResponse{Slots: s.states(req.GetIncludeFree(), c)}, nil
}
