package slotsapi

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/phases/internal/leasetest"
)

// The Slots service authorizes every call against its caller: a victim's
// lease cannot be listed, taken by a replayed Acquire, renewed or released
// by a principal the policy does not let act for its owner, and the
// victim's record and slot are unchanged afterwards.
func TestSlotsAuthorization(t *testing.T) {
	r := newSlotsRig(t, 8, 2)
	policy := leasetest.PolicyOf(t, 2, "uid:1001=tenant-a-*", "uid:65534=tenant-b-*")
	ctx := context.Background()

	victim, err := r.svc.Acquire(as(ctx, alice, policy), &phasegatev1.AcquireRequest{Owner: "tenant-a-1", RequestId: "sandbox-abc"})
	if err != nil {
		t.Fatal(err)
	}
	i := victim.GetSlot().GetIndex()
	before, ok, err := r.store.Get(int(i))
	if err != nil || !ok || before.Principal != "uid:1001" {
		t.Fatalf("victim's record: %+v %v %v; want principal uid:1001", before, ok, err)
	}
	attacker := as(ctx, mallet, policy)

	for _, tc := range refusedCalls(ctx, r.svc, attacker, as(ctx, alice, policy), victim) {
		if err := tc.call(); status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	list, err := r.svc.List(attacker, &phasegatev1.ListRequest{IncludeFree: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, sl := range list.GetSlots() {
		if sl.GetOwner() != "" {
			t.Errorf("List as %s shows slot %d of owner %q", mallet, sl.GetIndex(), sl.GetOwner())
		}
	}

	// A retry of the same request by another principal that may lease for
	// the owner gets AlreadyExists, never the lease.
	sibling := control.Principal{Kind: control.Unix, UID: 1002, GID: 1002}
	both := leasetest.PolicyOf(t, 0, "uid:1001=tenant-a-*", "uid:1002=tenant-a-*")
	_, err = r.svc.Acquire(as(ctx, sibling, both), &phasegatev1.AcquireRequest{Owner: "tenant-a-1", RequestId: "sandbox-abc"})
	if status.Code(err) != codes.AlreadyExists {
		t.Fatalf("a retry by another principal: %v, want AlreadyExists", err)
	}
	after, ok, err := r.store.Get(int(i))
	if err != nil || !ok || after.LeaseID != before.LeaseID || after.Principal != before.Principal || !after.Expires.Equal(before.Expires) {
		t.Fatalf("victim's record changed: %+v -> %+v (%v %v)", before, after, ok, err)
	}

	// The victim's own retry gets its lease; its quota of 2 holds.
	again, err := r.svc.Acquire(as(ctx, alice, policy), &phasegatev1.AcquireRequest{Owner: "tenant-a-1", RequestId: "sandbox-abc"})
	if err != nil || again.GetLeaseId() != victim.GetLeaseId() || again.GetSlot().GetPrincipal() != "uid:1001" {
		t.Fatalf("the victim's retry: %v %v", again, err)
	}
	if _, err := r.svc.Acquire(as(ctx, alice, policy), &phasegatev1.AcquireRequest{Owner: "tenant-a-2"}); err != nil {
		t.Fatal(err)
	}
	_, err = r.svc.Acquire(as(ctx, alice, policy), &phasegatev1.AcquireRequest{Owner: "tenant-a-3"})
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "quota") {
		t.Fatalf("a third lease over a quota of 2: %v, want ResourceExhausted naming the quota", err)
	}
	// Root may act for every owner: it releases the victim's lease.
	if _, err := r.svc.Release(as(ctx, root, policy), &phasegatev1.ReleaseRequest{Index: i, LeaseId: victim.GetLeaseId()}); err != nil {
		t.Fatalf("root's release: %v", err)
	}
}

// Acquire takes no owner under "cni/": not for a principal the policy lets
// lease "cni/*", whatever its request id (a CNI key's, "future/eth0"), not
// for one granted attach for the network, not for root. Nothing is leased.
func TestAcquireRefusesCNIOwners(t *testing.T) {
	r := newSlotsRig(t, 4, 1)
	ctx := context.Background()
	policy := leasetest.PolicyOf(t, 0, "uid:65534=cni/*")
	attach := leasetest.PolicyOf(t, 0)
	rule, err := control.ParseRule("uid:1001=cni/pgnet", false)
	if err != nil {
		t.Fatal(err)
	}
	rule.Attach = true
	attach.Rules = append(attach.Rules, rule)
	for _, tc := range []struct {
		who       control.Principal
		p         *control.AccessPolicy
		requestID string
	}{
		{mallet, policy, "future/eth0"},
		{mallet, policy, ""},
		{alice, attach, "future/eth0"},
		{root, nil, "future/eth0"},
	} {
		_, err := r.svc.Acquire(as(ctx, tc.who, tc.p), &phasegatev1.AcquireRequest{Owner: "cni/pgnet", RequestId: tc.requestID})
		if st := status.Convert(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "made only by the CNI plugin's ADD") {
			t.Errorf("Acquire of cni/pgnet %q as %s: %v, want PermissionDenied naming the CNI plugin's ADD", tc.requestID, tc.who, err)
		}
	}
	if recs, err := r.store.Load(); err != nil || len(recs) != 0 {
		t.Fatalf("records after the refused Acquires: %v %v", recs, err)
	}
}

// refusedCall is a call the Slots API must refuse, with the code it must
// answer.
type refusedCall struct {
	name string
	call func() error
	want codes.Code
}

// refusedCalls are the calls on victim's lease an attacker makes (and its
// owner, guessing its lease id; and one not through the guard at all).
func refusedCalls(ctx context.Context, svc *Server, attacker, owner context.Context, victim *phasegatev1.AcquireResponse) []refusedCall {
	i := victim.GetSlot().GetIndex()
	return []refusedCall{
		{"acquire for the victim's owner", func() error {
			_, err := svc.Acquire(attacker, &phasegatev1.AcquireRequest{Owner: "tenant-a-1", RequestId: "sandbox-abc"})
			return err
		}, codes.PermissionDenied},
		{"release with the victim's lease id", func() error {
			_, err := svc.Release(attacker, &phasegatev1.ReleaseRequest{Index: i, LeaseId: victim.GetLeaseId()})
			return err
		}, codes.PermissionDenied},
		{"keepalive with the victim's lease id", func() error {
			_, err := svc.KeepAlive(attacker, &phasegatev1.KeepAliveRequest{Index: i, LeaseId: victim.GetLeaseId()})
			return err
		}, codes.PermissionDenied},
		{"get the victim's slot", func() error {
			_, err := svc.Get(attacker, &phasegatev1.GetRequest{Index: i})
			return err
		}, codes.PermissionDenied},
		{"release by the victim with a guessed lease id", func() error {
			_, err := svc.Release(owner, &phasegatev1.ReleaseRequest{Index: i, LeaseId: leases.NewLeaseID()})
			return err
		}, codes.PermissionDenied},
		{"a call that did not come through the guard", func() error {
			_, err := svc.List(ctx, &phasegatev1.ListRequest{})
			return err
		}, codes.Unauthenticated},
	}
}
