package reconcile_test

import (
	"context"
	"log"
	"time"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/reconcile"
	"github.com/phasegate/phasegate/network/slot"
)

// The reconciler finishes in the background what reclaim deferred or
// could not remove, and sweeps strays (a host veth without its namespace,
// a set element without a slot). Its owner runs it until the daemon
// stops. It needs root, so it is compiled but not run by go test.
func Example() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	cfg := slot.DefaultConfig()
	m, err := slot.NewManager(ctx, cfg, slot.DefaultOptions())
	if err != nil {
		log.Fatal(err)
	}
	idx, err := index.New(cfg.Slots, []int{5, 7}) // what reclaim left
	if err != nil {
		log.Fatal(err)
	}
	r := reconcile.New(m, idx, reconcile.Options{
		Interval: time.Minute,
		OnPass: func(p reconcile.Pass) {
			log.Printf("reconcile: freed %v, claimed %v, failed %d in %v", p.Freed, p.Claimed, len(p.Failed), p.Duration)
		},
	})
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }() // one pass at once, then every Interval

	// … serve …
	stop()
	if err := <-done; err != nil && ctx.Err() == nil {
		log.Print(err)
	}
}
