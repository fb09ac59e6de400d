package pool_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
)

// A warm pool of slots: filled in the background, handed out most
// recently returned first, trimmed after a grace period, and closed with
// every idle slot and every one being made destroyed. It needs root, so it
// is compiled but not run by go test.
func Example() {
	ctx := context.Background()
	cfg := slot.DefaultConfig()
	m, err := slot.NewManager(ctx, cfg, slot.DefaultOptions())
	if err != nil {
		log.Fatal(err)
	}
	idx, err := index.New(cfg.Slots, nil) // after reclaim: its quarantine here
	if err != nil {
		log.Fatal(err)
	}
	p, err := pool.New(m, idx, pool.Options{Target: 64, FillConcurrency: 4, Grace: 5 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := p.Close(ctx); err != nil {
			log.Print(err) // joined: one error per slot that could not be destroyed
		}
	}()
	if err := p.WaitReady(ctx, 8); err != nil { // the start waits for the first few
		log.Fatal(err)
	}

	s, err := p.Get(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.NetnsPath, s.HostIf, s.InsideAddr)
	// Put proves the slot clean (or recreates it) before the next owner
	// gets it.
	if err := p.Put(ctx, s); err != nil {
		log.Print(err)
	}
	snap := p.Snapshot()
	fmt.Println(len(snap.Idle), len(snap.InUse))
}
