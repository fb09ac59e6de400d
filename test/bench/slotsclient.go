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

// acquireBurst makes n Acquire calls (owner, request ids reqPrefix-k) to
// the Slots API at target from clients concurrent callers over one
// connection, as fast as they are
// answered. A call that fails is retried with its request id up to retries
// times (the API makes that idempotent) and otherwise counted as an error.
func acquireBurst(ctx context.Context, target string, n, clients int, owner, reqPrefix string, retries int) (burst, error) {
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
					b.leases = append(b.leases, leaseRef{index: int(resp.GetSlot().GetIndex()), leaseID: resp.GetLeaseId()})
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

// listAcquired counts the slots the API at target lists ACQUIRED by owner.
func listAcquired(ctx context.Context, target, owner string) (int, error) {
	conn, client, err := slotsConn(ctx, target)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := client.List(cctx, &phasegatev1.ListRequest{})
	if err != nil {
		return 0, fmt.Errorf("Slots.List: %w", err)
	}
	n := 0
	for _, s := range resp.GetSlots() {
		if s.GetState() == phasegatev1.SlotState_SLOT_STATE_ACQUIRED && s.GetOwner() == owner {
			n++
		}
	}
	return n, nil
}

// leaseSlots leases n slots to owner with the restore part's concurrency
// and retries; every call must succeed.
func (r *runner) leaseSlots(ctx context.Context, target string, n int, owner string) ([]int, LeaseSetup, error) {
	setup := LeaseSetup{N: n, Clients: r.o.leaseClients}
	if n == 0 {
		return nil, setup, nil
	}
	b, err := acquireBurst(ctx, target, n, r.o.leaseClients, owner, owner, 3)
	if err != nil {
		return nil, setup, err
	}
	if b.errors > 0 {
		return nil, setup, fmt.Errorf("leasing %d slots: %d Acquire calls failed (first: %s)", n, b.errors, b.firstErr)
	}
	seen := map[int]bool{}
	indices := make([]int, 0, n)
	for _, l := range b.leases {
		if seen[l.index] || l.leaseID == "" {
			return nil, setup, errors.New("leasing: a slot was handed out twice, or without a lease id")
		}
		seen[l.index] = true
		indices = append(indices, l.index)
	}
	setup.Ms, setup.PerS = ms(b.elapsed), float64(n)/b.elapsed.Seconds()
	return indices, setup, nil
}
