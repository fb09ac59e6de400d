package lifecycle_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// A phase's Stop runs after the tasks it deferred have returned: a task
// uses what its phase made, and the Stop closes it. Before, every Stop ran
// first and the tasks were waited for at the end, so a task could find its
// pool closed under it. Here the task, once cancelled, keeps using the
// resource for a while, and the resource's Stop must not have run by then;
// a later phase's task and Stop come first, in reverse order.
func TestPhaseStopWaitsForItsTasks(t *testing.T) {
	var closed atomic.Bool
	var usedAfterClose atomic.Bool
	var (
		mu    sync.Mutex
		order []string
	)
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "pool", Run: func(_ context.Context, p *lifecycle.Progress) error {
			p.Defer("fill", func(ctx context.Context, _ *lifecycle.Progress) error {
				<-ctx.Done()
				time.Sleep(50 * time.Millisecond) // finishing the slot in hand
				if closed.Load() {
					usedAfterClose.Store(true)
				}
				note("fill returned")
				return ctx.Err()
			})
			return nil
		}, Stop: func(context.Context) error { closed.Store(true); note("pool stopped"); return nil }},
		{Name: "register", DependsOn: []string{"pool"}, Run: func(_ context.Context, p *lifecycle.Progress) error {
			p.Defer("expiry", func(ctx context.Context, _ *lifecycle.Progress) error {
				<-ctx.Done()
				note("expiry returned")
				return ctx.Err()
			})
			return nil
		}, Stop: func(context.Context) error { note("register stopped"); return nil }},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := lc.Drain(context.Background()); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if usedAfterClose.Load() {
		t.Error("the task used the pool after the pool's Stop")
	}
	want := []string{"expiry returned", "register stopped", "fill returned", "pool stopped"}
	if strings.Join(order, ", ") != strings.Join(want, ", ") {
		t.Errorf("order %q, want %q", order, want)
	}
}

// A task that ignores its cancelled ctx is waited for one stop timeout; its
// phase is then stopped anyway and the drain's error names it.
func TestTaskThatIgnoresCancellationIsNamed(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var stopped atomic.Bool
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "reclaim", Run: func(_ context.Context, p *lifecycle.Progress) error {
			p.Defer("reclaim-dead", func(context.Context, *lifecycle.Progress) error { <-release; return nil })
			return nil
		}, Stop: func(context.Context) error { stopped.Store(true); return nil }},
	}, lifecycle.WithStopTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	err = lc.Drain(context.Background())
	if err == nil || !strings.Contains(err.Error(), `phase "reclaim": background task(s) reclaim-dead still running: stop timeout 100ms passed`) {
		t.Errorf("Drain: %v, want the task named", err)
	}
	if !stopped.Load() {
		t.Error("the phase was not stopped after its task's wait ran out")
	}
}

// A drain hurried from its start (its ctx already ended), with a task that
// returns as soon as it is cancelled or none, reports nothing: a select that raced the tasks'
// end against the ctx used to report "background tasks still running" with
// none left.
func TestHurriedDrainWithTasksDoneReportsNothing(t *testing.T) {
	for i := range 200 {
		withTask := i%2 == 0
		lc, err := lifecycle.New([]lifecycle.Phase{
			{Name: "pool", Run: func(_ context.Context, p *lifecycle.Progress) error {
				if withTask {
					p.Defer("fill", func(ctx context.Context, _ *lifecycle.Progress) error { <-ctx.Done(); return ctx.Err() })
				}
				return nil
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := lc.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := lc.Drain(ctx); err != nil {
			t.Fatalf("round %d (task: %v): hurried drain: %v", i, withTask, err)
		}
	}
}
