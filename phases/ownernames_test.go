package phases

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/internal/leasetest"
	"github.com/phasegate/phasegate/phases/slotsapi"
)

// Leases recorded before the rule, under names it refuses, keep working:
// restored, listed as recorded (NFC and NFD apart), renewed, read and
// released by their principal; /debug/slots prints them escaped, in ASCII;
// and the same names are refused to a new Acquire, a retry of their own
// request included (the lease is reached by its index and lease id).
func TestNamesRecordedBeforeTheRuleKeepWorking(t *testing.T) {
	old := map[int]struct{ owner, requestID string }{
		1: {"rt-victim\u3164", "sandbox-abc"},
		2: {"caf\u00e9", ""},
		3: {"cafe\u0301", ""},
		4: {"rt-vict\u0430m", "req-1"},
		5: {"\uff52\uff54-victim", "req\u200b"},
	}
	r := newRestoreRig(t, 8, len(old), func(rec *leases.Record) {
		rec.Owner, rec.RequestID = old[rec.Index].owner, old[rec.Index].requestID
		if rec.Index == 4 {
			rec.Principal = alice.String()
		}
	}, func(context.Context, *slot.Manager, []*slot.Slot) {})
	api := slotsapi.New(r.d.slots)
	ctx := as(context.Background(), root, nil)
	r.verifyInBackground(t)
	st := r.states()
	for i, o := range old {
		if st[i].GetState() != phasegatev1.SlotState_SLOT_STATE_ACQUIRED || st[i].GetOwner() != o.owner || st[i].GetRequestId() != o.requestID {
			t.Errorf("slot %d restored: %v of %q (%q), want ACQUIRED of %q (%q)", i, st[i].GetState(), st[i].GetOwner(), st[i].GetRequestId(), o.owner, o.requestID)
		}
	}
	if _, err := api.KeepAlive(ctx, &phasegatev1.KeepAliveRequest{Index: 1, LeaseId: r.recs[1].LeaseID}); err != nil {
		t.Errorf("KeepAlive of a lease whose owner the rule refuses: %v", err)
	}
	if got, err := api.Get(ctx, &phasegatev1.GetRequest{Index: 3}); err != nil || got.GetSlot().GetOwner() != "cafe\u0301" {
		t.Errorf("Get of the NFD owner's lease: %v %v", got, err)
	}
	if _, err := api.Release(as(context.Background(), alice, nil), &phasegatev1.ReleaseRequest{Index: 4, LeaseId: r.recs[4].LeaseID}); err != nil {
		t.Errorf("Release by its own principal of a lease whose owner the rule refuses: %v", err)
	}
	if _, err := api.Release(ctx, &phasegatev1.ReleaseRequest{Index: 2, LeaseId: r.recs[2].LeaseID}); err != nil {
		t.Errorf("Release by root of the NFC owner's lease: %v", err)
	}
	if got := r.states(); got[3].GetOwner() != "cafe\u0301" || got[2].GetOwner() != "" || got[4].GetOwner() != "" {
		t.Errorf("after the NFC owner's lease was released: slot 2 %v, 3 %v, 4 %v; want 3 alone, its NFD owner untouched", got[2], got[3], got[4])
	}
	for _, req := range []*phasegatev1.AcquireRequest{
		{Owner: "rt-victim\u3164", RequestId: "new"},
		{Owner: "\uff52\uff54-victim", RequestId: "req\u200b"},
	} {
		if _, err := api.Acquire(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Acquire %q / %q, recorded before the rule: %v, want InvalidArgument", req.GetOwner(), req.GetRequestId(), err)
		}
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/debug/slots", nil)
	req = req.WithContext(control.WithCaller(req.Context(), control.Caller{Principal: root, Grant: (&control.AccessPolicy{}).Grant(root)}))
	api.DebugHandler().ServeHTTP(rec, req)
	body := rec.Body.String()
	if !leasetest.Printable(strings.ReplaceAll(body, "\n", " ")) || !strings.Contains(body, `"rt-victim\u3164"`) || !strings.Contains(body, `"cafe\u0301"`) {
		t.Errorf("/debug/slots: want ASCII naming the recorded names escaped:\n%s", body)
	}
}
