package network_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/reconcile"
	"github.com/phasegate/phasegate/network/slot"
)

// The order in which a daemon uses the network layer. It needs root, so it
// is compiled but not run by go test.
func Example() {
	ctx := context.Background()
	cfg := slot.DefaultConfig()
	if err := cfg.Validate(); err != nil {
		log.Fatal(err) // clear messages, each wrapping slot.ErrInvalidConfig
	}
	m, err := slot.NewManager(ctx, cfg, slot.Options{})
	if err != nil {
		log.Fatal(err)
	}

	// Reclaim what an earlier run leaked, within a budget.
	rep, err := reclaim.Run(ctx, m, reclaim.Options{
		Budget:   10 * time.Second,
		Progress: func(done, total int) { fmt.Printf("\rreclaim %d/%d", done, total) },
	})
	if err != nil {
		log.Print(err) // the report is still valid
	}
	log.Print(rep)

	// The allocator, with what reclaim deferred or could not remove
	// quarantined until the reconciler frees it.
	st, err := index.New(cfg.Slots, rep.Quarantine())
	if err != nil {
		log.Fatal(err)
	}

	p, err := pool.New(m, st, pool.Options{Target: 64, FillConcurrency: 4})
	if err != nil {
		log.Fatal(err)
	}
	if err := p.WaitReady(ctx, 8); err != nil {
		log.Fatal(err)
	}

	rctx, stop := context.WithCancel(ctx)
	r := reconcile.New(m, st, reconcile.Options{Interval: time.Minute})
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()

	s, err := p.Get(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.NetnsPath, s.HostIf, s.InsideAddr)
	if err := p.Put(ctx, s); err != nil {
		log.Print(err)
	}

	// An API listing every index: storage says free/acquired/quarantined,
	// the pool says which acquired ones are idle, in use or being created.
	ps, ss := p.Snapshot(), st.Snapshot()
	fmt.Println(len(ps.Idle), len(ps.InUse), ss.Free, ss.Quarantined)

	stop()
	<-done
	if err := p.Close(ctx); err != nil {
		log.Print(err)
	}
}
