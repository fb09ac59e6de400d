package slotsapi

import (
	"context"
	"encoding/binary"
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
	"github.com/phasegate/phasegate/phases/internal/leasetest"
	"github.com/phasegate/phasegate/server"
)

// A policy of thousands of ranges costs its principal's rate as many
// calls: a tenant at the default rate sets one, then is refused for the
// next (nothing changes) until its bucket refills, while root's changes
// go on.
func TestLargePoliciesSpendTheRate(t *testing.T) {
	r := newSlotsRig(t, 4, 2)
	tenant := leasetest.PolicyOf(t, 0, "uid:1001=tenant-*")
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
			tenant := leasetest.PolicyOf(b, 0, "uid:1001=tenant-*")
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
