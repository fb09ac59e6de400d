package lease

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"

	"github.com/phasegate/phasegate/control"
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

// A principal's leases publish at most its quota of host ports
// (max_ports), counted over all of them: more is refused as ErrExhausted
// with nothing changed, at Acquire and at SetPorts; a change that adds
// none is taken; root's and another principal's ports count against
// neither; a released lease gives its ports back.
func TestPublishedPortsWithinThePrincipalsQuota(t *testing.T) {
	r := newRig(t, 4, 1)
	ctx := context.Background()
	two := 2
	p := leasetest.PolicyOf(t, 0, "uid:65534=m-*", "uid:1001=a-*")
	p.MaxPorts = &two
	mallet, alice, root := leasetest.CallerOf(leasetest.Mallet, p), leasetest.CallerOf(leasetest.Alice, p), leasetest.CallerOf(leasetest.Root, nil)
	port := func(n uint16) ports.Mapping {
		return ports.Mapping{HostPort: 47820 + n, SlotPort: 80, Protocol: ports.TCP}
	}
	acquire := func(c control.Caller, owner string, ms ...ports.Mapping) (Acquired, error) {
		return r.svc.Acquire(ctx, c, Request{Owner: owner, RequestID: owner, Ports: ms})
	}
	m1, err := acquire(mallet, "m-1", port(0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(root, "r", port(1), port(2), port(3)); err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(alice, "a-1", port(4), port(5)); err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(mallet, "m-2", port(6), port(7)); !errors.Is(err, ErrExhausted) {
		t.Fatalf("a second lease taking mallet to 3 host ports of 2: %v, want %v", err, ErrExhausted)
	}
	i, id := m1.Lease.Rec.Index, m1.Lease.Rec.LeaseID
	if _, err := r.svc.SetPorts(ctx, mallet, i, id, []ports.Mapping{port(0), port(6), port(7)}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("SetPorts to 3 host ports of 2: %v, want %v", err, ErrExhausted)
	}
	if got := r.entries(t); len(got) != 6 {
		t.Fatalf("after the refusals the maps hold %d elements, want 6: %v", len(got), got)
	}
	if _, err := r.svc.SetPorts(ctx, mallet, i, id, []ports.Mapping{port(0), port(6)}); err != nil {
		t.Fatalf("SetPorts to 2 host ports of 2: %v", err)
	}
	if err := r.svc.Release(ctx, mallet, i, id); err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(mallet, "m-3", port(6), port(7)); err != nil {
		t.Fatalf("2 host ports of 2 once the first lease is released: %v", err)
	}
}
