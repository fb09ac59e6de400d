package lease

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/phases/internal/leasetest"
)

// writeCounter is the durable store, counting its write transactions by
// kind: "put idle", "put leased", "update", "delete".
type writeCounter struct {
	*leases.Store
	mu     sync.Mutex
	writes map[string]int
}

func (w *writeCounter) count(kind string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes[kind]++
}

func (w *writeCounter) Put(ctx context.Context, recs ...leases.Record) error {
	w.count("put " + recs[0].State.String())
	return w.Store.Put(ctx, recs...)
}

func (w *writeCounter) Update(ctx context.Context, index int, fn func(*leases.Record) error) (leases.Record, error) {
	w.count("update")
	return w.Store.Update(ctx, index, fn)
}

func (w *writeCounter) Delete(ctx context.Context, indices ...int) error {
	w.count("delete")
	return w.Store.Delete(ctx, indices...)
}

// take returns the writes counted since the last take.
func (w *writeCounter) take() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.writes
	w.writes = map[string]int{}
	return out
}

// Each transition of a slot writes its record once (Records): an
// Acquire on an empty pool writes the lease alone (the slot made for it is
// not first recorded idle), and a Release removes the record in the
// transaction that checks the lease id, after which the teardown writes
// nothing and the slot made in its place is recorded idle once. The pool
// is wired as the daemon wires it; docs/BENCHMARKS.md ("Writes per
// Acquire and Release") has the counts before and after.
func TestOneRecordWritePerTransition(t *testing.T) {
	_, mgr, store := leasetest.NewSlotHost(t, 4)
	w := &writeCounter{Store: store, writes: map[string]int{}}
	log := slog.New(slog.DiscardHandler)
	records := NewRecords(w, log)
	idx, err := index.New(4, nil)
	if err != nil {
		t.Fatal(err)
	}
	// No warm target: every Acquire finds the pool empty but for a
	// Release's replacement, and the grace keeps that one.
	pl, err := pool.New(mgr, idx, pool.Options{Grace: time.Hour, OnIdle: records.Idle, OnGone: records.Gone})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pl.Close(context.Background()) })
	svc := New(mgr, pl, Options{Records: records, Log: log})
	ctx, c := context.Background(), leasetest.CallerOf(leasetest.Root, nil)

	steps := []struct {
		name string
		do   func() error
		want map[string]int
	}{
		{"Acquire on an empty pool", func() error {
			_, err := svc.Acquire(ctx, c, Request{Owner: "a", RequestID: "1"})
			return err
		}, map[string]int{"put leased": 1}},
		{"Release, and the slot made in its place", func() error {
			l := svc.table.copyAt(1)
			if l == nil {
				return errors.New("slot 1 is not leased")
			}
			if err := svc.Release(ctx, c, 1, l.Rec.LeaseID); err != nil {
				return err
			}
			leasetest.WaitUntil(t, "the replacement made warm", func() bool { return len(pl.Snapshot().Idle) == 1 })
			return nil
		}, map[string]int{"update": 1, "put idle": 1}},
		{"Acquire from the warm pool", func() error {
			_, err := svc.Acquire(ctx, c, Request{Owner: "a", RequestID: "2"})
			return err
		}, map[string]int{"put leased": 1}},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := w.take(); !maps.Equal(got, s.want) {
			t.Errorf("%s wrote %v, want %v", s.name, got, s.want)
		}
	}
}
