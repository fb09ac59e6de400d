package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// leaseRef is a lease Acquire answered.
type leaseRef struct {
	index   int
	leaseID string
	// policy is the egress policy it was acquired with (canonicalPolicy).
	policy string
}

// burst is what a burst of Acquire calls did.
type burst struct {
	leases   []leaseRef
	lat      []time.Duration // of the calls answered
	elapsed  time.Duration
	errors   int
	firstErr string
}

// slotsConn opens a client connection to the Slots API at target (a gRPC
// target: unix:///path of a control socket), connected before it returns (a
// Get of slot 1, which answers whatever its state), so that the connection
// is not part of what is measured next.
func slotsConn(ctx context.Context, target string) (*grpc.ClientConn, phasegatev1.SlotsClient, error) {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, nil, fmt.Errorf("grpc client: %w", err)
	}
	client := phasegatev1.NewSlotsClient(conn)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := client.Get(cctx, &phasegatev1.GetRequest{Index: 1}, grpc.WaitForReady(true)); err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("Slots.Get on %s: %w", target, err)
	}
	return conn, client, nil
}

// acquireBurst makes n Acquire calls (owner, request ids reqPrefix-k, and
// what dress adds to the k-th when dress is not nil) to the Slots API at
// target from clients concurrent callers over one connection, as fast as
// they are answered. A call that fails is retried with its request id up
// to retries times (the API makes that idempotent) and otherwise counted
// as an error.
func acquireBurst(ctx context.Context, target string, n, clients int, owner, reqPrefix string, retries int,
	dress func(k int, req *phasegatev1.AcquireRequest)) (burst, error) {
	var b burst
	conn, client, err := slotsConn(ctx, target)
	if err != nil {
		return b, err
	}
	defer conn.Close()
	var (
		next atomic.Int64
		mu   sync.Mutex
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				k := int(next.Add(1))
				if k > n || ctx.Err() != nil {
					return
				}
				req := &phasegatev1.AcquireRequest{Owner: owner, RequestId: fmt.Sprintf("%s-%d", reqPrefix, k)}
				if dress != nil {
					dress(k, req)
				}
				var (
					resp *phasegatev1.AcquireResponse
					err  error
					took time.Duration
				)
				for range retries + 1 {
					cctx, cancel := context.WithTimeout(ctx, time.Minute)
					t0 := time.Now()
					resp, err = client.Acquire(cctx, req)
					took = time.Since(t0)
					cancel()
					if err == nil || ctx.Err() != nil {
						break
					}
				}
				mu.Lock()
				if err != nil {
					b.errors++
					if b.firstErr == "" {
						b.firstErr = err.Error()
					}
				} else {
					b.lat = append(b.lat, took)
					b.leases = append(b.leases, leaseRef{index: int(resp.GetSlot().GetIndex()), leaseID: resp.GetLeaseId(),
						policy: canonicalPolicy(req.GetEgressPolicy())})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b.elapsed = time.Since(start)
	if err := ctx.Err(); err != nil {
		return b, err
	}
	return b, nil
}

// countAcquired counts the slots in the ACQUIRED state.
func countAcquired(slots []*phasegatev1.Slot) int {
	n := 0
	for _, s := range slots {
		if s.GetState() == phasegatev1.SlotState_SLOT_STATE_ACQUIRED {
			n++
		}
	}
	return n
}

// listOwned returns the slots the API at target lists with owner, in any
// state.
func listOwned(ctx context.Context, target, owner string) ([]*phasegatev1.Slot, error) {
	conn, client, err := slotsConn(ctx, target)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := client.List(cctx, &phasegatev1.ListRequest{})
	if err != nil {
		return nil, fmt.Errorf("Slots.List: %w", err)
	}
	var out []*phasegatev1.Slot
	for _, s := range resp.GetSlots() {
		if s.GetOwner() == owner {
			out = append(out, s)
		}
	}
	return out, nil
}

// leaseSlots leases n slots to owner with the restore part's concurrency
// and retries, the k-th with what dress adds to its request (dress nil:
// nothing); every call must succeed.
func (r *runner) leaseSlots(ctx context.Context, target string, n int, owner string,
	dress func(k int, req *phasegatev1.AcquireRequest)) ([]leaseRef, LeaseSetup, error) {
	setup := LeaseSetup{N: n, Clients: r.o.leaseClients}
	if n == 0 {
		return nil, setup, nil
	}
	b, err := acquireBurst(ctx, target, n, r.o.leaseClients, owner, owner, 3, dress)
	if err != nil {
		return nil, setup, err
	}
	if b.errors > 0 {
		return nil, setup, fmt.Errorf("leasing %d slots: %d Acquire calls failed (first: %s)", n, b.errors, b.firstErr)
	}
	seen := map[int]bool{}
	for _, l := range b.leases {
		if seen[l.index] || l.leaseID == "" {
			return nil, setup, errors.New("leasing: a slot was handed out twice, or without a lease id")
		}
		seen[l.index] = true
	}
	setup.Ms, setup.PerS = ms(b.elapsed), float64(n)/b.elapsed.Seconds()
	return b.leases, setup, nil
}

// indicesOf returns the leases' slot indices.
func indicesOf(leases []leaseRef) []int {
	out := make([]int, len(leases))
	for i, l := range leases {
		out[i] = l.index
	}
	return out
}
