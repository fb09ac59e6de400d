package phases

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/server"
)

// A change of one slot's policy does not wait for another slot's: each
// slot has its own lock, which the lease's end takes too.
func TestSetEgressPolicyLocksPerSlot(t *testing.T) {
	r := newSlotsRig(t, 4, 2)
	ctx := as(context.Background(), root, nil)
	var ids []string
	var idx []uint32
	for k := range 2 {
		resp, err := r.svc.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "o", RequestId: fmt.Sprint(k)})
		if err != nil {
			t.Fatal(err)
		}
		ids, idx = append(ids, resp.GetLeaseId()), append(idx, resp.GetSlot().GetIndex())
	}
	set := func(k int) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := r.svc.SetEgressPolicy(ctx, &phasegatev1.SetEgressPolicyRequest{Index: idx[k], LeaseId: ids[k],
				EgressPolicy: &phasegatev1.EgressPolicy{DenyAll: true}})
			done <- err
		}()
		return done
	}
	release := func(k int) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := r.svc.Release(ctx, &phasegatev1.ReleaseRequest{Index: idx[k], LeaseId: ids[k]})
			done <- err
		}()
		return done
	}
	r.svc.table.mu.Lock()
	ns1 := *r.svc.table.leased[int(idx[1])].slot
	r.svc.table.mu.Unlock()
	// A change of slot 1 under way: its lock is held.
	unlock := r.svc.lockPolicy(int(idx[1]))
	blocked, ended := set(1), release(1)
	select {
	case err := <-set(0):
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("slot 0's policy change waited for slot 1's lock")
	}
	select {
	case err := <-blocked:
		t.Fatalf("slot 1's change went on while its lock was held: %v", err)
	default:
	}
	// The release ends the record, then waits for the lock before the slot
	// is torn down: the namespace is still there well after a teardown
	// would have taken it (one takes a few milliseconds here).
	waitUntil(t, "slot 1's record ended", func() bool { _, ok, _ := r.store.Get(int(idx[1])); return !ok })
	time.Sleep(300 * time.Millisecond)
	if id, err := netns.Stat(ns1.NetnsPath); err != nil || id != ns1.NetnsID {
		t.Fatalf("slot 1 was torn down while a change of its policy was under way: %v", err)
	}
	unlock()
	for _, c := range []<-chan error{blocked, ended} {
		select {
		case <-c: // either order: the change, then the release; or the release first, and the change refused
		case <-time.After(time.Minute):
			t.Fatal("slot 1's calls never ended once its lock was free")
		}
	}
}

// A policy of thousands of ranges costs its principal's rate as many
// calls: a tenant at the default rate sets one, then is refused for the
// next (nothing changes) until its bucket refills, while root's changes
// go on.
func TestLargePoliciesSpendTheRate(t *testing.T) {
	r := newSlotsRig(t, 4, 2)
	tenant := policyOf(t, 0, "uid:1001=tenant-*")
	tenant.Rate = control.DefaultRate
	guard, err := control.NewGuard(tenant, control.GuardOptions{Service: phasegatev1.Slots_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	pc := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: server.PeerCred{UID: alice.UID, GID: alice.GID}})
	viaGuard := func(method string, req any, call func(context.Context, any) (any, error)) (any, error) {
		return guard.Intercept(pc, req, &grpc.UnaryServerInfo{FullMethod: method}, call)
	}
	big := &phasegatev1.EgressPolicy{Allow: rangesOf(4096, 20), Deny: rangesOf(4096, 30)}
	resp, err := viaGuard(phasegatev1.Slots_Acquire_FullMethodName, &phasegatev1.AcquireRequest{Owner: "tenant-1", EgressPolicy: big},
		func(ctx context.Context, req any) (any, error) {
			return r.svc.Acquire(ctx, req.(*phasegatev1.AcquireRequest))
		})
	if err != nil {
		t.Fatalf("a tenant's first large policy, with a full bucket: %v", err)
	}
	acq := resp.(*phasegatev1.AcquireResponse)
	before, _, _ := r.store.Get(int(acq.GetSlot().GetIndex()))
	_, err = viaGuard(phasegatev1.Slots_SetEgressPolicy_FullMethodName,
		&phasegatev1.SetEgressPolicyRequest{Index: acq.GetSlot().GetIndex(), LeaseId: acq.GetLeaseId(), EgressPolicy: &phasegatev1.EgressPolicy{Allow: rangesOf(4096, 40), Deny: rangesOf(4096, 50)}},
		func(ctx context.Context, req any) (any, error) {
			return r.svc.SetEgressPolicy(ctx, req.(*phasegatev1.SetEgressPolicyRequest))
		})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a second large policy at once: %v, want ResourceExhausted", err)
	}
	if after, _, _ := r.store.Get(int(acq.GetSlot().GetIndex())); !reflect.DeepEqual(after, before) {
		t.Errorf("the refused change changed the record: %+v, was %+v", after, before)
	}
	mine, err := r.svc.Acquire(as(context.Background(), root, nil), &phasegatev1.AcquireRequest{Owner: "root-1", EgressPolicy: big})
	if err != nil {
		t.Fatalf("root, meanwhile: %v", err)
	}
	if _, err := r.svc.SetEgressPolicy(as(context.Background(), root, nil), &phasegatev1.SetEgressPolicyRequest{
		Index: mine.GetSlot().GetIndex(), LeaseId: mine.GetLeaseId(), EgressPolicy: big}); err != nil {
		t.Errorf("root's second large policy: %v", err)
	}
}

// waitUntil polls cond every 10 ms for up to a minute.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// BenchmarkSetEgressPolicyBesideChurn measures root's policy changes (one
// allowed range) alone, and beside another principal that replaces a
// policy of 4,096 allowed and 4,096 denied ranges on its own slot in a loop:
// unrated (called in process, as fast as it can: what the locks alone
// give), and rated (through the control guard at the default rate, where
// each such call costs 128 calls of it, control.Charge; a refusal is
// retried after a millisecond). Each op is one of root's changes; p50 and
// p99 are reported.
//
//	go test -run '^$' -bench SetEgressPolicyBesideChurn -benchtime 300x -count 3 ./phases/
func BenchmarkSetEgressPolicyBesideChurn(b *testing.B) {
	for _, churn := range []string{"none", "unrated", "rated"} {
		b.Run("churn="+churn, func(b *testing.B) {
			r := newSlotsRig(b, 4, 2)
			rootCtx := as(context.Background(), root, nil)
			tenant := policyOf(b, 0, "uid:1001=tenant-*")
			tenant.Rate = control.DefaultRate
			guard, err := control.NewGuard(tenant, control.GuardOptions{Service: phasegatev1.Slots_ServiceDesc.ServiceName})
			if err != nil {
				b.Fatal(err)
			}
			mine, err := r.svc.Acquire(rootCtx, &phasegatev1.AcquireRequest{Owner: "root-1"})
			if err != nil {
				b.Fatal(err)
			}
			theirs, err := r.svc.Acquire(as(context.Background(), alice, tenant), &phasegatev1.AcquireRequest{Owner: "tenant-1"})
			if err != nil {
				b.Fatal(err)
			}
			big := &phasegatev1.SetEgressPolicyRequest{Index: theirs.GetSlot().GetIndex(), LeaseId: theirs.GetLeaseId(),
				EgressPolicy: &phasegatev1.EgressPolicy{Allow: rangesOf(4096, 20), Deny: rangesOf(4096, 30)}}
			set := func() error {
				_, err := r.svc.SetEgressPolicy(as(context.Background(), alice, tenant), big)
				return err
			}
			if churn == "rated" {
				info := &grpc.UnaryServerInfo{FullMethod: phasegatev1.Slots_SetEgressPolicy_FullMethodName}
				pc := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: server.PeerCred{UID: alice.UID, GID: alice.GID}})
				set = func() error {
					_, err := guard.Intercept(pc, big, info, func(ctx context.Context, req any) (any, error) {
						return r.svc.SetEgressPolicy(ctx, req.(*phasegatev1.SetEgressPolicyRequest))
					})
					if status.Code(err) == codes.ResourceExhausted {
						time.Sleep(time.Millisecond)
					}
					return err
				}
			}
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for churn != "none" {
					select {
					case <-stop:
						return
					default:
					}
					_ = set()
				}
			}()
			small := &phasegatev1.SetEgressPolicyRequest{Index: mine.GetSlot().GetIndex(), LeaseId: mine.GetLeaseId(),
				EgressPolicy: &phasegatev1.EgressPolicy{Allow: []string{"198.51.100.0/24"}}}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				if _, err := r.svc.SetEgressPolicy(rootCtx, small); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			close(stop)
			<-done
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}

// rangesOf returns n /24s from first.0.0.0 on, as a client writes them.
func rangesOf(n int, first byte) []string {
	out := make([]string, n)
	for i := range n {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], uint32(first)<<24|uint32(i)<<8)
		out[i] = netip.PrefixFrom(netip.AddrFrom4(a), 24).String()
	}
	return out
}
