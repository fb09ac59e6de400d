package phases

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/leases"
)

// policyOf builds a resolved policy from command-line rules.
func policyOf(t testing.TB, maxLeases int, rules ...string) *control.AccessPolicy {
	t.Helper()
	p := &control.AccessPolicy{MaxLeases: &maxLeases}
	for _, r := range rules {
		rule, err := control.ParseRule(r, false)
		if err != nil {
			t.Fatal(err)
		}
		p.Rules = append(p.Rules, rule)
	}
	return p
}

// The Slots service authorizes every call against its caller: a victim's
// lease cannot be listed, taken by a replayed Acquire, renewed or released
// by a principal the policy does not let act for its owner, and the
// victim's record and slot are unchanged afterwards.
func TestSlotsAuthorization(t *testing.T) {
	r := newSlotsRig(t, 8, 2)
	policy := policyOf(t, 2, "uid:1001=tenant-a-*", "uid:65534=tenant-b-*")
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

	for _, tc := range []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"acquire for the victim's owner", func() error {
			_, err := r.svc.Acquire(attacker, &phasegatev1.AcquireRequest{Owner: "tenant-a-1", RequestId: "sandbox-abc"})
			return err
		}, codes.PermissionDenied},
		{"release with the victim's lease id", func() error {
			_, err := r.svc.Release(attacker, &phasegatev1.ReleaseRequest{Index: i, LeaseId: victim.GetLeaseId()})
			return err
		}, codes.PermissionDenied},
		{"keepalive with the victim's lease id", func() error {
			_, err := r.svc.KeepAlive(attacker, &phasegatev1.KeepAliveRequest{Index: i, LeaseId: victim.GetLeaseId()})
			return err
		}, codes.PermissionDenied},
		{"get the victim's slot", func() error {
			_, err := r.svc.Get(attacker, &phasegatev1.GetRequest{Index: i})
			return err
		}, codes.PermissionDenied},
		{"release by the victim with a guessed lease id", func() error {
			_, err := r.svc.Release(as(ctx, alice, policy), &phasegatev1.ReleaseRequest{Index: i, LeaseId: leases.NewLeaseID()})
			return err
		}, codes.PermissionDenied},
		{"a call that did not come through the guard", func() error {
			_, err := r.svc.List(ctx, &phasegatev1.ListRequest{})
			return err
		}, codes.Unauthenticated},
	} {
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
	both := policyOf(t, 0, "uid:1001=tenant-a-*", "uid:1002=tenant-a-*")
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

// Who may change a lease: its principal, or one the policy lets act for
// its owner; a CNI attachment, whose lease id the runtime never sees and
// Get shows to exactly these, is its principal's and root's: neither
// leasing its owner nor attach for its network is enough.
func TestMayAct(t *testing.T) {
	p, err := control.ParsePolicy(strings.NewReader(`{"principals": [
	    {"uid": 1000, "owners": ["cni/*", "sandbox-*"]},
	    {"uid": 1001, "owners": ["cni/pgnet"], "attach": true},
	    {"uid": 1002, "owners": ["*"], "read_only": true}
	  ]}`))
	if err != nil {
		t.Fatal(err)
	}
	caller := func(uid uint32) control.Caller {
		pr := control.Principal{Kind: control.Unix, UID: uid, GID: uid}
		return control.Caller{Principal: pr, Grant: p.Grant(pr)}
	}
	attached := leases.Record{Owner: "cni/pgnet", Principal: "uid:0", Attachment: &leases.Attachment{NetnsPath: "/run/netns/c1", IfName: "eth0"}}
	ownAttachment := attached
	ownAttachment.Principal = "uid:1000"
	leased := leases.Record{Owner: "sandbox-1", Principal: "uid:0"}
	for _, tc := range []struct {
		what string
		c    control.Caller
		rec  leases.Record
		want bool
	}{
		{"root, any attachment", caller(0), attached, true},
		{"root, any lease", caller(0), leased, true},
		{"leases cni/*, without attach", caller(1000), attached, false},
		{"leases cni/*, its own attachment", caller(1000), ownAttachment, true},
		{"leases sandbox-*", caller(1000), leased, true},
		{"attach for the network, root's attachment", caller(1001), attached, false},
		{"attach for the network, its own attachment", caller(1001), func() leases.Record { r := attached; r.Principal = "uid:1001"; return r }(), true},
		{"attach for the network, a lease of another owner", caller(1001), leased, false},
		{"reads everything", caller(1002), attached, false},
		{"reads everything, a lease", caller(1002), leased, false},
	} {
		if got := mayAct(tc.c, tc.rec); got != tc.want {
			t.Errorf("%s: mayAct %v, want %v", tc.what, got, tc.want)
		}
	}
}

// With no quota said (--max-leases unset, no max_leases in the policy), a
// tenant leases a quarter of the slots and is refused the next, naming
// its quota; root, which has none, leases the rest.
func TestDefaultQuotaLeavesRootTheRest(t *testing.T) {
	const n = 8
	r := newSlotsRig(t, n, 2)
	rule, err := control.ParseRule("uid:65534=tenant-b-*", false)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Slots.Slots, cfg.Control.Policy = n, &control.AccessPolicy{Rules: []control.Rule{rule}}
	policy := cfg.ControlPolicy()
	ctx := context.Background()
	held := 0
	for i := range n {
		_, err := r.svc.Acquire(as(ctx, mallet, policy), &phasegatev1.AcquireRequest{Owner: fmt.Sprintf("tenant-b-%d", i)})
		if err != nil {
			if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "quota") {
				t.Fatalf("Acquire %d as %s: %v, want ResourceExhausted naming the quota", i, mallet, err)
			}
			break
		}
		held++
	}
	if held != n/4 {
		t.Errorf("%s leased %d of %d slots, want its share, %d", mallet, held, n, n/4)
	}
	for i := range n - held {
		if _, err := r.svc.Acquire(as(ctx, root, policy), &phasegatev1.AcquireRequest{Owner: fmt.Sprintf("root-%d", i)}); err != nil {
			t.Fatalf("root's Acquire %d, with %d slots leased: %v", i, held+i, err)
		}
	}
}
