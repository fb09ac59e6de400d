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
	"github.com/phasegate/phasegate/phases/internal/leasetest"
)

// With no quota said (--max-leases unset, no max_leases in the policy), a
// tenant leases a quarter of the slots and is refused the next, naming
// its quota; root, which has none, leases the rest.
func TestDefaultQuotaLeavesRootTheRest(t *testing.T) {
	const n = 8
	_, mgr, store := leasetest.NewSlotHost(t, n)
	svc := NewSlotsServer(mgr, leasetest.NewPool(t, mgr, store, n, 2), store, nil)
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
		_, err := svc.Acquire(leasetest.As(ctx, leasetest.Mallet, policy), &phasegatev1.AcquireRequest{Owner: fmt.Sprintf("tenant-b-%d", i)})
		if err != nil {
			if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "quota") {
				t.Fatalf("Acquire %d as %s: %v, want ResourceExhausted naming the quota", i, leasetest.Mallet, err)
			}
			break
		}
		held++
	}
	if held != n/4 {
		t.Errorf("%s leased %d of %d slots, want its share, %d", leasetest.Mallet, held, n, n/4)
	}
	for i := range n - held {
		if _, err := svc.Acquire(leasetest.As(ctx, leasetest.Root, policy), &phasegatev1.AcquireRequest{Owner: fmt.Sprintf("root-%d", i)}); err != nil {
			t.Fatalf("root's Acquire %d, with %d slots leased: %v", i, held+i, err)
		}
	}
}
