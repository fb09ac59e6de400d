package lease

import (
	"context"
	"crypto/subtle"
	"log/slog"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sync/singleflight"

	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/ports"
	"github.com/phasegate/phasegate/network/slot"
)

// Lease is a slot leased to an owner, as recorded. A lost lease has no
// slot: its objects were gone when the daemon restarted. A lease restored
// at a start has a check until its slot's kernel identity is verified
// (the daemon serves before that): its slot is then what the record says
// it is, and its index is the lease's whatever the check finds.
//
// The core hands out copies taken under its table's lock; a *Lease of
// the table itself is read under that lock only.
type Lease struct {
	Rec        leases.Record
	Slot       *slot.Slot
	LostReason string
	// Repaired is what was put back of its slot while held, shown by Get
	// and List.
	Repaired []string

	check *leaseCheck // nil once verified
	// deferred: past its deadline, its expiry was deferred because the
	// daemon was impaired (expiry.go); logged once until it is renewed.
	deferred bool
	// remains: lost while held (broken from outside, broken.go), with
	// what is left of its slot kept until the lease ends, which tears it
	// down.
	remains bool
	// seen: its link's counters as last read (usage.go), which a relink
	// carries into its ledger.
	seen linkSeen
}

// Restored is a lease restored at a start, not verified yet: the check
// of the restored leases ([RestoreCheck]) settles it.
func Restored(rec leases.Record, sl *slot.Slot) *Lease {
	return &Lease{Rec: rec, Slot: sl, check: newLeaseCheck()}
}

// Verifying reports whether the lease, restored at a start, waits for its
// check.
func (l *Lease) Verifying() bool { return l.check != nil }

// Service is the lease core: the leases of the daemon's slots over the
// pool (which owns the slot indices) and the durable records, as Go
// calls that take the caller (the principal the control surface's guard
// named, control.CallerFrom) and answer a lease or an [*Error]. Every
// lease is recorded before Acquire answers; Release and KeepAlive compare
// the lease id in the same transaction that changes the record. A lease
// is bound to the principal that took it. The adapters (phases/slotsapi,
// phases/cniapi) speak the wires.
type Service struct {
	cfg     slot.Config
	pool    *pool.Pool
	mgr     *slot.Manager // writes the leases' egress policies
	records *Records
	log     *slog.Logger
	audit   *slog.Logger // log with audit=true: what happened to a lease but a call
	breaks  *breaks      // leases found broken from outside (broken.go)
	tracer  trace.Tracer
	events  metric.Int64Counter // nil counts nothing
	// restore checks the leases restored unverified; nil when none was.
	restore *RestoreCheck

	acquiring singleflight.Group // one Acquire per owner and request id at a time

	// impaired says when the daemon last could not take the calls of a
	// lease's principal; nil: never (expiry.go).
	impaired Impairment
	stalled  atomic.Int64 // Unix ns when the expiry loop last ran late

	egress egress.Defaults // the daemon's part of every egress policy (the manager's)
	// policyMu holds one lock per slot index for the slot's egress
	// policy: one change at a time per slot, and a lease's end waits for
	// a change under way, so that no policy is written for a slot being
	// torn down (slot.Manager.ApplyEgress). Policies of different slots
	// are written at once.
	policyMu []sync.Mutex

	// table holds the leases; its mutex guards them (table.go).
	table *Table

	// owners are the host ports the leases publish (ports.go); portsMu
	// orders their changes with the elements' writes and a Sync, and
	// guards portsBy, the principal each publishing lease's ports are
	// counted against (by lease id: a lease not yet in the table too).
	owners  *ports.Owners
	portsMu sync.Mutex
	portsBy map[string]string

	// held are the daemon's held slots: a lost lease's index held keeps
	// what is there when the lease ends (nil: none is ever held).
	held *HeldSlots
	// teardown is how a held slot released is torn down; tornDown, when
	// set, is told each such teardown's result (the daemon's log of its
	// problems).
	teardown slot.TeardownOptions
	tornDown func(*slot.TeardownResult)
}

// Store is what the lease core needs of the durable records: the methods
// of *leases.Store it calls, with their contracts (Put refuses a request
// another slot's lease holds with *leases.DuplicateRequestError, and a
// full filesystem with leases.ErrNoSpace; Update refuses a missing record
// with leases.ErrNotFound, and deletes it when fn returns
// leases.ErrRemove; Delete deletes the records of the indices given, in
// one transaction, and ignores those with none). A retried Acquire is
// found in the core's own leases, not in the store.
//
// The benchmark's in-memory baseline (test/bench) is this core over a
// store in a map, so that the comparison measures the durable record and
// nothing else.
type Store interface {
	Put(ctx context.Context, recs ...leases.Record) error
	Update(ctx context.Context, index int, fn func(*leases.Record) error) (leases.Record, error)
	Delete(ctx context.Context, indices ...int) error
}

var _ Store = (*leases.Store)(nil)

// Options are what a [Service] is made of beside its manager and pool.
// Only Records and Log are required.
type Options struct {
	Records *Records
	// Table holds the leases restored at the start; nil: none.
	Table *Table
	Log   *slog.Logger
	// Tracer traces expiries; nil: none.
	Tracer trace.Tracer
	// Events counts what happens to leases, by event (the daemon's
	// phasegate.lease.events); nil counts nothing. The core adds to it
	// itself: the metric is the OpenTelemetry API's, not a call back into
	// the daemon.
	Events metric.Int64Counter
	// Restore checks the restored leases; nil when none was restored.
	Restore *RestoreCheck
	// Impaired says when the daemon last could not take a principal's
	// calls (expiry.go); nil: never.
	Impaired Impairment
	// Health shows the leases broken from outside; nil: not shown.
	Health Warnings
	// Held are the daemon's held slots; nil: none is ever held.
	Held *HeldSlots
	// Teardown is how a held slot the operator releases is torn down, and
	// TornDown, when set, is told each such teardown's result.
	Teardown slot.TeardownOptions
	TornDown func(*slot.TeardownResult)
}

// New returns the lease core over pl, which owns the slot indices and
// makes its slots with m; the egress policies' defaults are m's.
func New(m *slot.Manager, pl *pool.Pool, o Options) *Service {
	cfg := m.Config()
	if o.Table == nil {
		o.Table = NewTable(nil)
	}
	if o.Tracer == nil {
		o.Tracer = noop.NewTracerProvider().Tracer("")
	}
	s := &Service{cfg: cfg, pool: pl, mgr: m, records: o.Records, log: o.Log, audit: o.Log.With("audit", true),
		breaks: &breaks{health: o.Health}, tracer: o.Tracer, events: o.Events, restore: o.Restore, impaired: o.Impaired,
		egress: m.EgressDefaults(), policyMu: make([]sync.Mutex, cfg.Slots+1), table: o.Table, held: o.Held, teardown: o.Teardown, tornDown: o.TornDown,
		owners: ports.NewOwners(m.Firewall().NetNS()), portsBy: map[string]string{}}
	s.loadPorts()
	return s
}

// Config returns the configuration of the slots the core leases.
func (s *Service) Config() slot.Config { return s.cfg }

// EgressDefaults returns the daemon's part of every egress policy.
func (s *Service) EgressDefaults() egress.Defaults { return s.egress }

// Manager returns the manager of the core's slots.
func (s *Service) Manager() *slot.Manager { return s.mgr }

// Log returns the core's log.
func (s *Service) Log() *slog.Logger { return s.log }

// Settle waits until restored lease l is verified, if it is one (see
// RestoreCheck.settle): on a nil return it is ACQUIRED or LOST.
func (s *Service) Settle(ctx context.Context, l *Lease) error {
	if s.restore == nil {
		return nil // no lease was restored: none waits for a check
	}
	return s.restore.settle(ctx, l)
}

func (s *Service) count(event string) {
	if s.events != nil {
		s.events.Add(context.Background(), 1, metric.WithAttributes(attribute.String("event", event)))
	}
}

// Counts returns how many leases are held and how many of them are lost.
func (s *Service) Counts() (held, lost int) { return s.table.counts() }

// CheckNames refuses an Acquire whose owner or request id (when given)
// breaks the names rule (internal/names): a name that could look like
// another's is never leased. A name recorded before the rule is not
// checked again: its lease keeps working by index and lease id. (A CNI
// network's owner is refused whatever its request id, refuseCNIOwner: an
// attachment's key is checked by the ADD that alone makes one.)
func CheckNames(owner, requestID string) error {
	err := names.Check("owner", owner)
	if err == nil && requestID != "" {
		err = names.Check("request_id", requestID)
	}
	if err != nil {
		return wrapError(ErrInvalid, err, err.Error())
	}
	return nil
}

// checkIndex refuses an index that is none: 0 is not an index at all,
// one beyond --slots is one this daemon does not have.
func (s *Service) checkIndex(i int) error {
	switch {
	case i <= 0:
		return Errorf(ErrInvalid, "index is required (slots are numbered from 1)")
	case i > s.cfg.Slots:
		return Errorf(ErrNotFound, "slot %d does not exist (slots are 1..%d)", i, s.cfg.Slots)
	}
	return nil
}

// sameLease compares lease ids in constant time: a lease id is a
// capability, and the time a comparison takes must not tell how much of a
// guess was right.
func sameLease(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
