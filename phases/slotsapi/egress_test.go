package slotsapi

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/inside"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/phases/internal/leasetest"
)

// egressRig is a slots rig for the egress policy's tests.
func egressRig(t *testing.T) *slotsRig {
	t.Helper()
	return newSlotsRig(t, 4, 1)
}

// inSlot is what slot i's namespace holds now; the host's chain for the
// slot must hold the same policy.
func inSlot(t *testing.T, r *slotsRig, i int) inside.Found {
	t.Helper()
	l := r.leases.At(i)
	if l == nil || l.Slot == nil {
		t.Fatalf("slot %d is not leased", i)
	}
	f, err := r.mgr.InspectInside(l.Slot)
	if err != nil {
		t.Fatal(err)
	}
	st, err := r.mgr.InspectEgress(context.Background(), l.Slot)
	if err != nil {
		t.Fatal(err)
	}
	if st.Host != f.Fingerprint {
		t.Errorf("slot %d: the host's chain holds policy %q, the slot's own table %q", i, st.Host, f.Fingerprint)
	}
	return f
}

// A slot's root that flushes its own tables lifts nothing (the host's
// chain holds the policy) and Get sees it, says so and puts the tables
// back; the record is unchanged.
func TestGetRepairsDrift(t *testing.T) {
	r := egressRig(t)
	ctx := as(context.Background(), root, nil)
	p := &phasegatev1.EgressPolicy{Deny: []string{"203.0.113.0/24"}}
	resp, err := r.svc.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "o", RequestId: "drift", EgressPolicy: p})
	if err != nil {
		t.Fatal(err)
	}
	i := resp.GetSlot().GetIndex()
	before, _, _ := r.store.Get(int(i))
	if got, err := r.svc.Get(ctx, &phasegatev1.GetRequest{Index: i}); err != nil || len(got.GetSlot().GetRepaired()) != 0 {
		t.Fatalf("Get of an intact slot: repaired %q, %v", got.GetSlot().GetRepaired(), err)
	}
	flushInside(t, resp.GetSlot().GetNetnsPath())
	sl := r.leases.At(int(i)).Slot
	if st, err := r.mgr.InspectEgress(context.Background(), sl); err != nil || st.Inside != "" || st.Host != fingerprint(t, r, p) {
		t.Fatalf("after the flush: %+v, %v; want the host's chain alone", st, err)
	}
	got, err := r.svc.Get(ctx, &phasegatev1.GetRequest{Index: i})
	if err != nil || !slices.Equal(got.GetSlot().GetRepaired(), []string{"egress policy inside (missing)"}) {
		t.Errorf("Get after the flush: repaired %q, %v", got.GetSlot().GetRepaired(), err)
	}
	if f := inSlot(t, r, int(i)); f.Fingerprint != fingerprint(t, r, p) {
		t.Errorf("the slot's table after Get: %q, want %q", f.Fingerprint, fingerprint(t, r, p))
	}
	if rec, _, _ := r.store.Get(int(i)); !reflect.DeepEqual(rec, before) {
		t.Errorf("the record changed: %+v, was %+v", rec, before)
	}
}

// A lease without a policy or a guest device has its slot's settings
// checked too: what its root changed of them Get puts back and says.
func TestGetRepairsSettings(t *testing.T) {
	r := egressRig(t)
	ctx := as(context.Background(), root, nil)
	resp, err := r.svc.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "o", RequestId: "settings"})
	if err != nil {
		t.Fatal(err)
	}
	i := resp.GetSlot().GetIndex()
	if got, err := r.svc.Get(ctx, &phasegatev1.GetRequest{Index: i}); err != nil || len(got.GetSlot().GetRepaired()) != 0 {
		t.Fatalf("Get of an intact slot: repaired %q, %v", got.GetSlot().GetRepaired(), err)
	}
	if out, err := exec.Command("nsenter", "--net="+resp.GetSlot().GetNetnsPath(), "sysctl", "-qw", "net.ipv4.conf.eth0.forwarding=1").CombinedOutput(); err != nil {
		t.Fatalf("forwarding on inside: %v\n%s", err, out)
	}
	got, err := r.svc.Get(ctx, &phasegatev1.GetRequest{Index: i})
	if err != nil || !slices.Equal(got.GetSlot().GetRepaired(), []string{"settings of eth0"}) {
		t.Errorf("Get after forwarding was turned on: repaired %q, %v; want [settings of eth0]", got.GetSlot().GetRepaired(), err)
	}
}

// flushInside is `nft flush ruleset` by root in the namespace at path.
func flushInside(t *testing.T, path string) {
	t.Helper()
	fd, err := netns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	c.FlushRuleset()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

func fingerprint(t *testing.T, r *slotsRig, p *phasegatev1.EgressPolicy) string {
	t.Helper()
	pol, err := parseEgress(p, r.leases.EgressDefaults())
	if err != nil {
		t.Fatal(err)
	}
	return pol.Fingerprint(r.leases.EgressDefaults())
}

// hostile are policies every call must refuse with InvalidArgument.
var hostile = []struct {
	name string
	p    *phasegatev1.EgressPolicy
}{
	{"malformed", &phasegatev1.EgressPolicy{Allow: []string{"1.2.3.4/"}}},
	{"overlapping", &phasegatev1.EgressPolicy{Deny: []string{"10.0.0.0/8", "10.9.0.0/16"}}},
	{"/0", &phasegatev1.EgressPolicy{Deny: []string{"0.0.0.0/0"}}},
	{"IPv6", &phasegatev1.EgressPolicy{Allow: []string{"2001:db8::1"}}},
	{"too many", &phasegatev1.EgressPolicy{Allow: strings.Split(strings.Repeat("1.1.1.1,", egress.MaxEntries+1), ",")}},
	{"redirect without a proxy", &phasegatev1.EgressPolicy{RedirectTcp: true}},
}

func TestAcquireWithEgressPolicy(t *testing.T) {
	r := egressRig(t)
	ctx := as(context.Background(), root, nil)
	for _, tc := range hostile {
		_, err := r.svc.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "o", RequestId: tc.name, EgressPolicy: tc.p})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: Acquire = %v, want InvalidArgument", tc.name, err)
		}
	}
	if recs, err := r.store.Load(); err != nil || len(recs) != 0 {
		t.Fatalf("records after refused Acquires: %+v %v; want none", recs, err)
	}
	if s := r.pool.Snapshot(); len(s.InUse) != 0 {
		t.Fatalf("slots handed out by refused Acquires: %v", s.InUse)
	}

	p := &phasegatev1.EgressPolicy{Allow: []string{"8.8.8.8", "1.1.1.0/24"}, Deny: []string{"203.0.113.7"}}
	resp, err := r.svc.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "o", RequestId: "ok", EgressPolicy: p})
	if err != nil {
		t.Fatal(err)
	}
	i := int(resp.GetSlot().GetIndex())
	want := &phasegatev1.EgressPolicy{Allow: []string{"1.1.1.0/24", "8.8.8.8/32"}, Deny: []string{"203.0.113.7/32"}}
	if got := resp.GetSlot().GetEgressPolicy(); !reflect.DeepEqual(got.GetAllow(), want.Allow) || !reflect.DeepEqual(got.GetDeny(), want.Deny) {
		t.Errorf("Acquire shows policy %v, want %v", got, want)
	}
	if f := inSlot(t, r, i); f.Fingerprint != fingerprint(t, r, p) {
		t.Errorf("slot's rules %q, want the policy's %q", f.Fingerprint, fingerprint(t, r, p))
	}
	rec, ok, err := r.store.Get(i)
	if err != nil || !ok || rec.Egress == nil || !reflect.DeepEqual(egressProto(rec.Egress).GetAllow(), want.Allow) {
		t.Errorf("record %+v %v %v; want the policy", rec, ok, err)
	}
	got, err := r.svc.Get(ctx, &phasegatev1.GetRequest{Index: uint32(i)})
	if err != nil || !reflect.DeepEqual(got.GetSlot().GetEgressPolicy().GetAllow(), want.Allow) {
		t.Errorf("Get: %v %v", got, err)
	}
	// Gone with the lease: the record, and the namespace with its rules.
	if _, err := r.svc.Release(ctx, &phasegatev1.ReleaseRequest{Index: uint32(i), LeaseId: resp.GetLeaseId()}); err != nil {
		t.Fatal(err)
	}
	if rec, ok, _ := r.store.Get(i); ok && rec.Egress != nil {
		t.Errorf("record after Release still has a policy: %+v", rec)
	}
}

// SetEgressPolicy is authorized as Release: only the lease's principal or
// one the policy lets act for its owner, never a read-only principal, and
// a refused or invalid call changes neither the rules nor the record.
func TestSetEgressPolicy(t *testing.T) {
	r := egressRig(t)
	policy := leasetest.PolicyOf(t, 0, "uid:1001=tenant-a-*", "uid:65534=tenant-b-*")
	reader, err := control.ParseRule("uid:1002=tenant-a-*", true)
	if err != nil {
		t.Fatal(err)
	}
	policy.Rules = append(policy.Rules, reader)
	ctx := context.Background()
	first := &phasegatev1.EgressPolicy{Allow: []string{"192.0.2.0/24"}}
	victim, err := r.svc.Acquire(as(ctx, alice, policy), &phasegatev1.AcquireRequest{Owner: "tenant-a-1", RequestId: "r", EgressPolicy: first})
	if err != nil {
		t.Fatal(err)
	}
	i, id := victim.GetSlot().GetIndex(), victim.GetLeaseId()
	before, _, _ := r.store.Get(int(i))
	replacement := &phasegatev1.EgressPolicy{DenyAll: true}
	unchanged := func(what string) {
		t.Helper()
		if f := inSlot(t, r, int(i)); f.Fingerprint != fingerprint(t, r, first) {
			t.Errorf("%s: the slot's rules changed (%q)", what, f.Fingerprint)
		}
		if rec, _, _ := r.store.Get(int(i)); !reflect.DeepEqual(rec, before) {
			t.Errorf("%s: the record changed: %+v, was %+v", what, rec, before)
		}
	}
	for _, tc := range refusedPolicyCalls(ctx, policy, i, id, replacement) {
		if _, err := r.svc.SetEgressPolicy(tc.ctx, tc.req); status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		unchanged(tc.name)
	}
	for _, tc := range hostile {
		_, err := r.svc.SetEgressPolicy(as(ctx, alice, policy), &phasegatev1.SetEgressPolicyRequest{Index: i, LeaseId: id, EgressPolicy: tc.p})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", tc.name, err)
		}
		unchanged(tc.name)
	}

	resp, err := r.svc.SetEgressPolicy(as(ctx, alice, policy), &phasegatev1.SetEgressPolicyRequest{Index: i, LeaseId: id, EgressPolicy: replacement})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetSlot().GetEgressPolicy().GetDenyAll() {
		t.Errorf("reply shows %v", resp.GetSlot().GetEgressPolicy())
	}
	if f := inSlot(t, r, int(i)); f.Fingerprint != fingerprint(t, r, replacement) {
		t.Errorf("rules %q after the change, want %q", f.Fingerprint, fingerprint(t, r, replacement))
	}
	if rec, _, _ := r.store.Get(int(i)); rec.Egress == nil || !rec.Egress.DenyAll {
		t.Errorf("record after the change: %+v", rec.Egress)
	}
	// A datagram from inside the slot is dropped by deny-all and counted in
	// Get (nothing leaves: the drop is in the namespace's output hook).
	sendFrom(t, resp.GetSlot().GetNetnsPath(), "192.0.2.9:9")
	got, err := r.svc.Get(as(ctx, alice, policy), &phasegatev1.GetRequest{Index: i})
	if err != nil || got.GetSlot().GetEgressDroppedPackets() == 0 {
		t.Errorf("Get after a dropped datagram: %v %v; want egress_dropped_packets > 0", got.GetSlot().GetEgressDroppedPackets(), err)
	}
	// Cleared by the principal's tool acting for the owner (root).
	if _, err := r.svc.SetEgressPolicy(as(ctx, root, nil), &phasegatev1.SetEgressPolicyRequest{Index: i, LeaseId: id}); err != nil {
		t.Fatal(err)
	}
	if f := inSlot(t, r, int(i)); f.Fingerprint != "" {
		t.Errorf("rules after clearing: %q", f.Fingerprint)
	}
	if rec, _, _ := r.store.Get(int(i)); rec.Egress != nil {
		t.Errorf("record after clearing: %+v", rec.Egress)
	}
	if _, err := r.svc.Release(as(ctx, alice, policy), &phasegatev1.ReleaseRequest{Index: i, LeaseId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.svc.SetEgressPolicy(as(ctx, alice, policy), &phasegatev1.SetEgressPolicyRequest{Index: i, LeaseId: id, EgressPolicy: first}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("after Release: %v, want FailedPrecondition", err)
	}
}

// sendFrom sends one UDP datagram to addr from inside the namespace at path.
func sendFrom(t *testing.T, path, addr string) {
	t.Helper()
	fd, err := netns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	err = netns.Do(fd, func() error {
		c, err := net.Dial("udp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("probe"))
		if errors.Is(err, syscall.EPERM) {
			return nil // an output-hook drop answers the sender EPERM
		}
		return err
	})
	if err != nil {
		t.Fatalf("send from %s: %v", path, err)
	}
}

// refusedPolicyCall is a SetEgressPolicy the Slots API must refuse, with
// the code it must answer.
type refusedPolicyCall struct {
	name string
	ctx  context.Context
	req  *phasegatev1.SetEgressPolicyRequest
	want codes.Code
}

// refusedPolicyCalls are the changes of slot i's policy (lease id) to
// replacement that policy lets no one make: by another tenant, a
// read-only principal of the owner (uid:1002), without the lease id, on
// no slot, and not through the guard.
func refusedPolicyCalls(ctx context.Context, policy *control.AccessPolicy, i uint32, id string, replacement *phasegatev1.EgressPolicy) []refusedPolicyCall {
	bob := control.Principal{Kind: control.Unix, UID: 1002, GID: 1002}
	return []refusedPolicyCall{
		{"another tenant with the lease id", as(ctx, mallet, policy), &phasegatev1.SetEgressPolicyRequest{Index: i, LeaseId: id, EgressPolicy: replacement}, codes.PermissionDenied},
		{"a read-only principal of the owner", as(ctx, bob, policy), &phasegatev1.SetEgressPolicyRequest{Index: i, LeaseId: id, EgressPolicy: replacement}, codes.PermissionDenied},
		{"the principal with a wrong lease id", as(ctx, alice, policy), &phasegatev1.SetEgressPolicyRequest{Index: i, LeaseId: leases.NewLeaseID(), EgressPolicy: replacement}, codes.PermissionDenied},
		{"no lease id", as(ctx, alice, policy), &phasegatev1.SetEgressPolicyRequest{Index: i, EgressPolicy: replacement}, codes.PermissionDenied},
		{"index 0", as(ctx, alice, policy), &phasegatev1.SetEgressPolicyRequest{LeaseId: id}, codes.InvalidArgument},
		{"beyond the slots", as(ctx, alice, policy), &phasegatev1.SetEgressPolicyRequest{Index: 99, LeaseId: id}, codes.NotFound},
		{"not through the guard", ctx, &phasegatev1.SetEgressPolicyRequest{Index: i, LeaseId: id, EgressPolicy: replacement}, codes.Unauthenticated},
	}
}
