package slotsapi

import (
	"context"
	"os/exec"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/shape"
)

// shapedNow is what holds slot i's link now.
func shapedNow(t *testing.T, r *slotsRig, i uint32) shape.Limits {
	t.Helper()
	l, err := shape.Survey(context.Background(), r.mgr.ShapeLink(ptr(r.mgr.Config().Slot(int(i)))))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func ptr[T any](v T) *T { return &v }

// ifbThere reports whether slot i's ifb exists.
func ifbThere(r *slotsRig, i uint32) bool {
	return exec.Command("ip", "link", "show", r.mgr.Config().ShaperIfName(int(i))).Run() == nil
}

// TestBandwidthThroughTheSlotsAPI follows a lease's limits through
// Acquire, Get, SetBandwidth and Release: refused limits change nothing,
// a qdisc deleted on the host is put back, a release leaves no ifb.
func TestBandwidthThroughTheSlotsAPI(t *testing.T) {
	r := newSlotsRig(t, 2, 1)
	ctx := as(context.Background(), root, nil)
	for _, bad := range []*phasegatev1.Bandwidth{
		{},                                   // every rate 0
		{IngressBurst: 1 << 20},              // a burst without a rate
		{EgressRate: 100},                    // 100 bit/s
		{IngressRate: 1 << 62},               // absurd
		{IngressRate: 40e6, IngressBurst: 8}, // a burst below one frame
	} {
		_, err := r.svc.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "o", RequestId: "bad", Bandwidth: bad})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("Acquire with %v: %v, want InvalidArgument", bad, err)
		}
	}
	if recs, err := r.store.Load(); err != nil || len(recs) != 0 {
		t.Fatalf("after the refusals the store holds %d records, %v", len(recs), err)
	}
	resp, err := r.svc.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "o", RequestId: "bw",
		Bandwidth: &phasegatev1.Bandwidth{IngressRate: 40e6, EgressRate: 20e6, EgressBurst: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	i, id := resp.GetSlot().GetIndex(), resp.GetLeaseId()
	want := &phasegatev1.Bandwidth{IngressRate: 40e6, IngressBurst: 800_000, EgressRate: 20e6, EgressBurst: 1 << 20}
	if got := resp.GetSlot().GetBandwidth(); got.String() != want.String() {
		t.Errorf("Acquire answered %v, want %v", got, want)
	}
	if got := shapedNow(t, r, i); got.IngressRate != 40e6 || got.EgressRate != 20e6 {
		t.Errorf("the link holds %v", got)
	}
	// Deleted on the host: Get puts it back and says so.
	if out, err := exec.Command("tc", "qdisc", "del", "dev", resp.GetSlot().GetHostInterface(), "root").CombinedOutput(); err != nil {
		t.Fatalf("tc: %v: %s", err, out)
	}
	got, err := r.svc.Get(ctx, &phasegatev1.GetRequest{Index: i})
	if err != nil || !slices.Contains(got.GetSlot().GetRepaired(), "bandwidth limits") || got.GetSlot().GetBandwidth().String() != want.String() {
		t.Errorf("Get after the qdisc's deletion: repaired %q, bandwidth %v, %v", got.GetSlot().GetRepaired(), got.GetSlot().GetBandwidth(), err)
	}
	if got := shapedNow(t, r, i); got.IngressRate != 40e6 {
		t.Errorf("after Get the link holds %v", got)
	}
	// Refused: nothing changes.
	if _, err := r.svc.SetBandwidth(ctx, &phasegatev1.SetBandwidthRequest{Index: i, LeaseId: id, Bandwidth: &phasegatev1.Bandwidth{}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("SetBandwidth of zeros: %v", err)
	}
	if got := shapedNow(t, r, i); got.IngressRate != 40e6 || got.EgressRate != 20e6 {
		t.Errorf("after a refused SetBandwidth the link holds %v", got)
	}
	// Out of the slot only.
	set, err := r.svc.SetBandwidth(ctx, &phasegatev1.SetBandwidthRequest{Index: i, LeaseId: id, Bandwidth: &phasegatev1.Bandwidth{EgressRate: 8e6}})
	if err != nil || set.GetSlot().GetBandwidth().GetIngressRate() != 0 || set.GetSlot().GetBandwidth().GetEgressBurst() != shape.DefaultBurstMin {
		t.Fatalf("SetBandwidth out only: %v, %v", set.GetSlot().GetBandwidth(), err)
	}
	if rec, _, err := r.store.Get(int(i)); err != nil || rec.Bandwidth == nil || rec.Bandwidth.EgressRate != 8e6 || rec.Bandwidth.IngressRate != 0 {
		t.Errorf("the record holds %+v, %v", rec.Bandwidth, err)
	}
	if got := shapedNow(t, r, i); got.IngressRate != 0 || got.EgressRate != 8e6 {
		t.Errorf("out only: the link holds %v", got)
	}
	if _, err := r.svc.Release(ctx, &phasegatev1.ReleaseRequest{Index: i, LeaseId: id}); err != nil {
		t.Fatal(err)
	}
	if ifbThere(r, i) {
		t.Errorf("slot %d's ifb outlived its release", i)
	}
}
