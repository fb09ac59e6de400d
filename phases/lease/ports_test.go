package lease

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"

	"github.com/phasegate/phasegate/network/ports"
	"github.com/phasegate/phasegate/phases/internal/leasetest"
)

// Host ports of these tests: unusual ones, on every address of the host.
var (
	portA = ports.Mapping{HostPort: 47811, SlotPort: 80, Protocol: ports.TCP}
	portB = ports.Mapping{HostPort: 47812, SlotPort: 53, Protocol: ports.UDP}
)

// entries lists the slot table's published ports.
func (r *rig) entries(t *testing.T) []ports.Entry {
	t.Helper()
	got, err := r.svc.mgr.Ports().List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A lease's published ports are written with it, refused to another lease,
// changed, kept across a new core over the same records (a restart), put
// back by a reconcile, and gone with the lease.
func TestPublishedPortsFollowTheLease(t *testing.T) {
	r := newRig(t, 3, 1)
	ctx, c := context.Background(), leasetest.CallerOf(leasetest.Root, nil)
	a, err := r.svc.Acquire(ctx, c, Request{Owner: "o", RequestID: "a", Ports: []ports.Mapping{portA}})
	if err != nil {
		t.Fatal(err)
	}
	i, id := a.Lease.Rec.Index, a.Lease.Rec.LeaseID
	to := r.svc.slotAddr(i)
	if got := r.entries(t); !slices.Equal(got, []ports.Entry{{Mapping: portA, To: to}}) {
		t.Fatalf("after Acquire: %v", got)
	}
	if rec, _, _ := r.store.Get(i); !slices.Equal(rec.Ports, []ports.Mapping{portA}) {
		t.Fatalf("recorded ports %v", rec.Ports)
	}
	for _, tc := range []struct {
		name, id string
		ms       []ports.Mapping
		want     Kind
	}{
		{"another lease's host port", "taken", []ports.Mapping{portA}, ErrExists},
		{"two mappings of one host port", "twice", []ports.Mapping{portB, {HostPort: portB.HostPort, SlotPort: 1, Protocol: ports.UDP}}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.svc.Acquire(ctx, c, Request{Owner: "o", RequestID: "b-" + tc.id, Ports: tc.ms})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Acquire = %v, want %v", err, tc.want)
			}
			if got := r.entries(t); len(got) != 1 {
				t.Fatalf("a refused Acquire changed the maps: %v", got)
			}
		})
	}
	if _, err := r.svc.SetPorts(ctx, c, i, id, []ports.Mapping{portA, portB}); err != nil {
		t.Fatal(err)
	}
	if got := r.entries(t); len(got) != 2 {
		t.Fatalf("after SetPorts: %v", got)
	}
	// A new core over the same records claims the same ports.
	rec, _, _ := r.store.Get(i)
	log := slog.New(slog.DiscardHandler)
	again := New(r.svc.mgr, r.pool, Options{Records: NewRecords(r.store, log), Log: log,
		Table: NewTable([]*Lease{{Rec: rec, Slot: r.svc.At(i).Slot}})})
	if got := again.owners.Of(id); !slices.Equal(got, []ports.Mapping{portA, portB}) {
		t.Fatalf("restored claims %v", got)
	}
	// A deleted element is put back by a reconcile's Sync.
	if err := r.svc.mgr.Ports().Set(ctx, "", to, []ports.Mapping{portB}, nil); err != nil {
		t.Fatal(err)
	}
	if added, removed, err := r.svc.SyncPorts(ctx); err != nil || added != 1 || removed != 0 {
		t.Fatalf("SyncPorts = %d, %d, %v; want 1 put back", added, removed, err)
	}
	if err := r.svc.Release(ctx, c, i, id); err != nil {
		t.Fatal(err)
	}
	if got := r.entries(t); len(got) != 0 {
		t.Fatalf("after Release: %v", got)
	}
	if got := r.svc.owners.Of(id); len(got) != 0 {
		t.Fatalf("after Release the lease still owns %v", got)
	}
}
