package main

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/phases"
)

// The in-memory store answers the Slots service as the durable one does:
// the same records, the same refusals, so that the Acquire comparison
// measures the record's cost and nothing else.
func TestMemStoreAnswersAsTheDurableStore(t *testing.T) {
	durable, err := leases.Open(filepath.Join(t.TempDir(), "state.db"), leases.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer durable.Close()
	for name, st := range map[string]phases.LeaseStore{"durable": durable, "memory": newMemStore()} {
		t.Run(name, func(t *testing.T) { checkLeaseStore(t, st) })
	}
}

func checkLeaseStore(t *testing.T, st phases.LeaseStore) {
	ctx := context.Background()
	now := time.Now().Round(0)
	lease := func(i int, request string) leases.Record {
		return leases.Record{Index: i, State: leases.Leased, Owner: "o", LeaseID: leases.NewLeaseID(), RequestID: request,
			Principal: "uid:0", Acquired: now, Created: now}
	}
	a := lease(1, "r1")
	if err := st.Put(ctx, a); err != nil {
		t.Fatal(err)
	}
	var dup *leases.DuplicateRequestError
	if err := st.Put(ctx, lease(2, "r1")); !errors.As(err, &dup) || dup.Index != 1 {
		t.Errorf("Put of a request slot 1 holds = %v, want *DuplicateRequestError naming slot 1", err)
	}
	if err := st.Put(ctx, lease(3, "r1")); !errors.As(err, &dup) || dup.Index != 1 {
		t.Errorf("a refused Put lost the request: a third Put = %v, want *DuplicateRequestError naming slot 1", err)
	}
	if _, err := st.Update(ctx, 2, func(*leases.Record) error { return nil }); !errors.Is(err, leases.ErrNotFound) {
		t.Errorf("Update of no record = %v, want ErrNotFound", err)
	}
	refused := errors.New("refused")
	if _, err := st.Update(ctx, 1, func(*leases.Record) error { return refused }); !errors.Is(err, refused) {
		t.Errorf("Update whose fn refuses = %v, want its error", err)
	}
	got, err := st.Update(ctx, 1, func(r *leases.Record) error { r.TTL, r.Expires = time.Minute, now.Add(time.Minute); return nil })
	if err != nil || got.TTL != time.Minute {
		t.Errorf("Update = %+v %v, want the TTL set", got, err)
	}
	if _, err := st.Update(ctx, 1, func(*leases.Record) error { return leases.ErrRemove }); err != nil {
		t.Fatalf("Update removing: %v", err)
	}
	if err := st.Put(ctx, lease(2, "r1")); err != nil {
		t.Errorf("Put of a request freed by the removal: %v", err)
	}
	if err := st.Put(ctx, lease(3, ""), lease(4, "")); err != nil {
		t.Errorf("Put of two leases without a request id: %v, want both (no request is held)", err)
	}
	if err := st.Delete(ctx, 2, 3, 99); err != nil {
		t.Errorf("Delete of two records and an index with none: %v", err)
	}
	if _, err := st.Update(ctx, 2, func(*leases.Record) error { return nil }); !errors.Is(err, leases.ErrNotFound) {
		t.Errorf("Update after Delete = %v, want ErrNotFound", err)
	}
	if err := st.Put(ctx, lease(5, "r1")); err != nil {
		t.Errorf("Put of a request freed by Delete: %v", err)
	}
}
