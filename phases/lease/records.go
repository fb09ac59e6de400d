package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/slot"
)

// Records writes the durable record of every slot, and is the only
// code that does from the restore on (DESIGN.md section 6, "Who writes a
// record"). A record changes at a slot's transitions, one write each:
//
//	transition                                 record     called by
//	made warm, or given back unleased          idle       the pool (Options.OnIdle)
//	leased                                     leased     Acquire: over the idle record, or the first of a slot made for it
//	kept alive, policy changed                 leased     KeepAlive, SetEgressPolicy: the lease id checked in the same transaction
//	ended (Release, expiry)                    removed    Release, expiry: the lease id checked in the same transaction
//	torn down                                  removed    the pool (Options.OnGone), only if a record is left
//	restored at a start                        renewed    the reclaim phase (a fresh TTL; stale idle records deleted)
//
// It knows which indices have a record, so that the teardown that follows
// the end of a lease writes nothing: the record went in the transaction
// that ended the lease.
type Records struct {
	store Store
	log   *slog.Logger
	// OnWrite, when set, is told every write's outcome (the state
	// directory's health: stateWatch.wrote). Set before the first write.
	OnWrite func(error)

	mu  sync.Mutex
	has map[int]bool // indices with a record (those of unreadable ones included)
}

// NewRecords returns the writer of store's records, which holds the
// records of the indices in has.
func NewRecords(store Store, log *slog.Logger, has ...int) *Records {
	r := &Records{store: store, log: log, has: make(map[int]bool, len(has))}
	for _, i := range has {
		r.has[i] = true
	}
	return r
}

// RecordedIndices returns the indices of recs and bad: those with a record.
func RecordedIndices(recs []leases.Record, bad []int) []int {
	out := append(make([]int, 0, len(recs)+len(bad)), bad...)
	for _, rec := range recs {
		out = append(out, rec.Index)
	}
	return out
}

// mark notes that the indices have a record (true) or none (false).
func (r *Records) mark(recorded bool, indices ...int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, i := range indices {
		if recorded {
			r.has[i] = true
		} else {
			delete(r.has, i)
		}
	}
}

// Idle records s, which the pool is about to keep warm, so that a
// restart adopts it (pool.Options.OnIdle).
func (r *Records) Idle(ctx context.Context, s *slot.Slot) error {
	return r.Put(ctx, leases.Record{Index: s.Index, State: leases.Idle, Netns: s.NetnsID, HostIfindex: s.HostIfIndex, Created: time.Now()})
}

// wrote tells OnWrite the outcome of a write, and returns err.
func (r *Records) wrote(err error) error {
	if r.OnWrite != nil {
		r.OnWrite(err)
	}
	return err
}

// Put writes recs, each replacing its index's record.
func (r *Records) Put(ctx context.Context, recs ...leases.Record) error {
	if err := r.wrote(r.store.Put(ctx, recs...)); err != nil {
		return err
	}
	for _, rec := range recs {
		r.mark(true, rec.Index)
	}
	return nil
}

// update changes index's record with fn in one transaction (see
// [Store]); fn returning leases.ErrRemove deletes it.
func (r *Records) update(ctx context.Context, index int, fn func(*leases.Record) error) (leases.Record, error) {
	removed := false
	rec, err := r.store.Update(ctx, index, func(rec *leases.Record) error {
		err := fn(rec)
		removed = errors.Is(err, leases.ErrRemove)
		return err
	})
	r.wrote(err)
	if err == nil && removed {
		r.mark(false, index)
	}
	return rec, err
}

// Remove deletes the records of indices, in one transaction.
func (r *Records) Remove(ctx context.Context, indices ...int) error {
	if err := r.wrote(r.store.Delete(ctx, indices...)); err != nil {
		return err
	}
	r.mark(false, indices...)
	return nil
}

// Gone deletes the records left of slots the pool tore down
// (pool.Options.OnGone): none for a slot whose lease ended, whose record
// went with it. A record left behind would only be found stale at the
// next start.
func (r *Records) Gone(indices []int) {
	r.mu.Lock()
	var left []int
	for _, i := range indices {
		if r.has[i] {
			left = append(left, i)
		}
	}
	r.mu.Unlock()
	if len(left) == 0 {
		return
	}
	if err := r.Remove(context.Background(), left...); err != nil {
		r.log.Warn("records of slots torn down could not be deleted", "slots", fmt.Sprint(left), "error", err)
	}
}
