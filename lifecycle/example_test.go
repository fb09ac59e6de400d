package lifecycle_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// The daemon's startup graph from DESIGN.md section 3, with no-op bodies:
// listen and reclaim both wait only for lock, so the port never waits for
// host clean-up.
func Example() {
	noop := func(context.Context, *lifecycle.Progress) error { return nil }
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: noop},
		{Name: "listen", DependsOn: []string{"lock"}, Run: noop},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(3, "namespaces")
			for range 3 {
				p.Add(1)
			}
			return nil
		}},
		{Name: "storage", DependsOn: []string{"reclaim"}, Run: noop},
		{Name: "populate", DependsOn: []string{"storage"}, Run: noop},
		{Name: "register", DependsOn: []string{"listen", "populate"}, Run: noop},
		{Name: "serve", DependsOn: []string{"register"}, Run: noop},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := lc.Start(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	s := lc.Snapshot()
	fmt.Println(s.State)
	for _, p := range s.Phases {
		if p.Progress.IsZero() {
			fmt.Printf("%-8s %s\n", p.Name, p.State)
		} else {
			fmt.Printf("%-8s %s %s\n", p.Name, p.State, p.Progress)
		}
	}
	fmt.Println(lc.Drain(context.Background()), lc.State())
	// Output:
	// serving
	// lock     succeeded
	// listen   succeeded
	// reclaim  succeeded 3/3 namespaces
	// storage  succeeded
	// populate succeeded
	// register succeeded
	// serve    succeeded
	// <nil> stopped
}

// New reports every problem of a declaration at once.
func ExampleNew() {
	noop := func(context.Context, *lifecycle.Progress) error { return nil }
	_, err := lifecycle.New([]lifecycle.Phase{
		{Name: "reclaim", DependsOn: []string{"storage"}, Run: noop},
		{Name: "storage", DependsOn: []string{"reclaim"}, Run: noop},
		{Name: "populate", DependsOn: []string{"populate", "network"}, Run: noop},
	})
	fmt.Println(err)
	// Output:
	// phase "populate" depends on itself
	// phase "populate" depends on unknown phase "network"
	// dependency cycle: reclaim -> storage -> reclaim
}

// A hook sees every transition once, in order, whatever its speed: here it
// logs them. It runs on a goroutine of the lifecycle's, so it may lag; this
// one says when it has seen the final event.
func ExampleWithEventHook() {
	noop := func(context.Context, *lifecycle.Progress) error { return nil }
	seenAll := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: noop},
		{Name: "storage", DependsOn: []string{"lock"}, Retry: lifecycle.RetryPolicy{Attempts: 2},
			Run: flakyOnce(errors.New("device busy"))},
	}, lifecycle.WithEventHook(func(e lifecycle.Event) {
		fmt.Println(e)
		if e.Final() {
			close(seenAll)
		}
	}))
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = lc.Start(context.Background())
	_ = lc.Drain(context.Background())
	<-seenAll
	// Output:
	// #1 lifecycle created→starting
	// #2 phase lock pending→running (attempt 1)
	// #3 phase lock running→succeeded (attempt 1)
	// #4 phase storage pending→running (attempt 1)
	// #5 phase storage running→retrying (attempt 1): device busy
	// #6 phase storage retrying→running (attempt 2)
	// #7 phase storage running→succeeded (attempt 2)
	// #8 lifecycle starting→serving
	// #9 lifecycle serving→draining
	// #10 lifecycle draining→stopped
}

// flakyOnce returns a Run function that fails its first attempt with err.
func flakyOnce(err error) func(context.Context, *lifecycle.Progress) error {
	failed := false
	return func(context.Context, *lifecycle.Progress) error {
		if !failed {
			failed = true
			return err
		}
		return nil
	}
}

// WatchEvents follows the log from any position: history first, then live,
// never dropping an event. A snapshot's EventSeq is where to resume so that
// snapshot and events together see everything once.
func ExampleLifecycle_WatchEvents() {
	noop := func(context.Context, *lifecycle.Progress) error { return nil }
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "lock", Run: noop}})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = lc.Start(context.Background())
	snap := lc.Snapshot()
	fmt.Println("snapshot:", snap.State, "after event", snap.EventSeq)

	events := lc.WatchEvents(context.Background(), snap.EventSeq)
	lc.Warn("egress", "net.ipv4.ip_forward is 0")
	_ = lc.Drain(context.Background())
	for e := range events { // closed after the final event
		fmt.Println(e)
	}
	// Output:
	// snapshot: serving after event 4
	// #5 warning-set egress: net.ipv4.ip_forward is 0
	// #6 lifecycle serving→draining
	// #7 lifecycle draining→stopped
}

// Events are JSON with stable field names; fields that do not apply to an
// event's kind are left out.
func ExampleEvent() {
	e := lifecycle.Event{
		Seq:       5,
		Time:      time.Date(2026, 11, 30, 9, 14, 2, 0, time.UTC),
		Kind:      lifecycle.EventPhase,
		Name:      "storage",
		From:      lifecycle.PhaseRunning,
		To:        lifecycle.PhaseRetrying,
		Attempt:   1,
		Err:       "device busy",
		DependsOn: []string{"reclaim"},
	}
	b, _ := json.Marshal(e)
	fmt.Println(string(b))
	// Output:
	// {"seq":5,"time":"2026-11-30T09:14:02Z","kind":"phase","name":"storage","from":"running","to":"retrying","attempt":1,"error":"device busy","depends_on":["reclaim"]}
}

// A program serves until a signal or until the lifecycle can no longer
// serve, then drains; Err says why it failed, if it did.
func ExampleLifecycle_Done() {
	noop := func(context.Context, *lifecycle.Progress) error { return nil }
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "lock", Run: noop}})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := lc.Start(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	signal := make(chan struct{}) // os/signal.NotifyContext in a real main
	go func() { _ = lc.Fail(errors.New("reconciler died")) }()

	select {
	case <-signal:
	case <-lc.Done():
	}
	fmt.Println(lc.State(), lc.Err())
	fmt.Println(lc.Drain(context.Background()), lc.State(), lc.Err())
	// Output:
	// failed reconciler died
	// <nil> stopped reconciler died
}
