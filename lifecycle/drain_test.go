package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

func TestStartAndDrainConcurrentlyAndTwice(t *testing.T) {
	for round := range 20 {
		release := make(chan struct{})
		var stops atomic.Int32
		lc, err := lifecycle.New([]lifecycle.Phase{
			{Name: "lock", Run: nop, Stop: func(context.Context) error { stops.Add(1); return nil }},
			{Name: "populate", DependsOn: []string{"lock"}, Run: func(ctx context.Context, _ *lifecycle.Progress) error {
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range 3 {
			wg.Go(func() { errs[i] = lc.Start(context.Background()) })
		}
		if round%2 == 0 {
			close(release)
		}
		for i := 3; i < 6; i++ {
			wg.Go(func() { errs[i] = lc.Drain(context.Background()) })
		}
		wg.Wait()
		if round%2 != 0 {
			close(release)
		}
		if lc.State() != lifecycle.StateStopped && lc.State() != lifecycle.StateCreated {
			t.Fatalf("round %d: state %s after drains", round, lc.State())
		}
		if stops.Load() > 1 {
			t.Fatalf("round %d: stop ran %d times", round, stops.Load())
		}
		// Every Start got the one outcome of the start, or ErrClosed if it
		// came after a Drain.
		var outcome error
		outcomes := 0
		for i := range 3 {
			if !errors.Is(errs[i], lifecycle.ErrClosed) {
				if outcomes > 0 && fmt.Sprint(errs[i]) != fmt.Sprint(outcome) {
					t.Fatalf("round %d: Start results differ: %v vs %v", round, errs[i], outcome)
				}
				outcome = errs[i]
				outcomes++
			}
		}
		if err := lc.Start(context.Background()); !errors.Is(err, lifecycle.ErrClosed) {
			t.Fatalf("round %d: Start after Drain = %v, want ErrClosed", round, err)
		}
		if err := lc.Drain(context.Background()); err != nil {
			t.Fatalf("round %d: second Drain: %v", round, err)
		}
	}
}

func TestDrainBeforeStart(t *testing.T) {
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "lock", Run: nop}})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); !errors.Is(err, lifecycle.ErrClosed) {
		t.Fatalf("Start after Drain = %v, want ErrClosed", err)
	}
}

func TestDrainDuringStartIsDrainingNotFailed(t *testing.T) {
	running := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "reclaim", Run: func(ctx context.Context, _ *lifecycle.Progress) error {
		close(running)
		<-ctx.Done()
		return ctx.Err()
	}}})
	if err != nil {
		t.Fatal(err)
	}
	var states []lifecycle.State
	ch, cancel := lc.Subscribe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for s := range ch {
			if len(states) == 0 || states[len(states)-1] != s.State {
				states = append(states, s.State)
			}
		}
	}()
	startErr := make(chan error, 1)
	go func() { startErr <- lc.Start(context.Background()) }()
	<-running
	if err := lc.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-startErr; !errors.Is(err, lifecycle.ErrClosed) {
		t.Fatalf("Start = %v, want ErrClosed: cancelled by the drain", err)
	}
	cancel()
	<-done
	// A subscriber may miss a state it was too slow for, never see them out
	// of order; the lifecycle never reads as failed.
	order := []lifecycle.State{lifecycle.StateCreated, lifecycle.StateStarting, lifecycle.StateDraining, lifecycle.StateStopped}
	last := -1
	for _, s := range states {
		i := slices.Index(order, s)
		if i <= last {
			t.Fatalf("states %v are not a subsequence of %v", states, order)
		}
		last = i
	}
	s := lc.Snapshot()
	if s.State != lifecycle.StateStopped || s.Err != nil {
		t.Fatalf("final %s with err %v, want stopped without an error", s.State, s.Err)
	}
	if slices.ContainsFunc(s.History, func(tr lifecycle.Transition) bool { return tr.State == lifecycle.StateFailed }) {
		t.Fatalf("history %v passes through failed", s.History)
	}
	if p, _ := s.Phase("reclaim"); p.State != lifecycle.PhaseCancelled {
		t.Fatalf("reclaim is %s, want cancelled", p.State)
	}
}

func TestStopFunctionsHaveTheirOwnTimeout(t *testing.T) {
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: nop, Stop: func(context.Context) error { return nil }},
		{Name: "listen", DependsOn: []string{"lock"}, Run: nop, StopTimeout: 10 * time.Millisecond,
			Stop: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }},
	}, lifecycle.WithStopTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	err = lc.Drain(context.Background())
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `phase "listen": stop`) {
		t.Fatalf("Drain = %v, want listen's stop timing out", err)
	}
	if lc.State() != lifecycle.StateStopped {
		t.Fatalf("state %s, want stopped", lc.State())
	}
}
