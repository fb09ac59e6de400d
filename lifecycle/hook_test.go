package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// hookRecorder is a hook that keeps what it is handed and lets a test wait
// until it has seen n events.
type hookRecorder struct {
	mu     sync.Mutex
	events []lifecycle.Event
	more   chan struct{} // closed and replaced at every event
	delay  time.Duration // makes the hook deliberately slow
}

func newHookRecorder(delay time.Duration) *hookRecorder {
	return &hookRecorder{more: make(chan struct{}), delay: delay}
}

func (h *hookRecorder) record(e lifecycle.Event) {
	if h.delay > 0 {
		time.Sleep(h.delay)
	}
	h.mu.Lock()
	h.events = append(h.events, e)
	close(h.more)
	h.more = make(chan struct{})
	h.mu.Unlock()
}

// waitFor waits until the hook has seen n events and returns them.
func (h *hookRecorder) waitFor(t *testing.T, n int) []lifecycle.Event {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		h.mu.Lock()
		got, more := slices.Clone(h.events), h.more
		h.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-more:
		case <-deadline:
			t.Fatalf("the hook saw %d events, want %d: %v", len(got), n, got)
		}
	}
}

// A hook may call back into the lifecycle, Drain included, from any event —
// here from the running event of a phase that waits for its cancellation,
// which is delivered while the runner, the phase and the Start call all wait.
func TestHookMayDrainTheLifecycle(t *testing.T) {
	var drained atomic.Value
	var lc *lifecycle.Lifecycle
	hook := newHookRecorder(0)
	var err error
	lc, err = lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: nop},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			<-ctx.Done()
			return ctx.Err()
		}},
	}, lifecycle.WithEventHook(func(e lifecycle.Event) {
		_ = lc.Snapshot()
		_ = lc.Events(0)
		if e.Name == "reclaim" && e.To == lifecycle.PhaseRunning {
			lc.Warn("hook", "draining from the hook")
			drained.Store(fmt.Sprint(lc.Drain(context.Background())))
		}
		hook.record(e)
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); !errors.Is(err, lifecycle.ErrClosed) {
		t.Fatalf("Start = %v, want cancelled by the hook's drain", err)
	}
	if err := lc.Wait(context.Background()); err != nil {
		t.Fatalf("Wait = %v, want nil after a drain", err)
	}
	log := lc.Events(0)
	if !log[len(log)-1].Final() {
		t.Fatalf("log does not end stopped: %v", log)
	}
	if got := hook.waitFor(t, len(log)); !reflect.DeepEqual(got, log) {
		t.Fatalf("hook saw %v, want %v", got, log)
	}
	if drained.Load() != "<nil>" {
		t.Fatalf("the hook's Drain returned %v", drained.Load())
	}
}

func TestSlowHookAndSlowWatcherLoseNothing(t *testing.T) {
	hook := newHookRecorder(200 * time.Microsecond)
	lc, err := lifecycle.New(sevenPhases(), lifecycle.WithEventHook(hook.record))
	if err != nil {
		t.Fatal(err)
	}
	watched := make(chan []lifecycle.Event, 1)
	go func() {
		var out []lifecycle.Event
		for e := range lc.WatchEvents(context.Background(), 0) {
			time.Sleep(200 * time.Microsecond)
			out = append(out, e)
		}
		watched <- out
	}()
	for range 3 {
		lc.Warn("egress", "a")
		lc.ClearWarning("egress")
	}
	mustStart(t, lc)
	mustDrain(t, lc)
	log := lc.Events(0)
	checkDense(t, log)
	if got := <-watched; !reflect.DeepEqual(got, log) {
		t.Fatalf("the watcher saw %d events, the log has %d", len(got), len(log))
	}
	if got := hook.waitFor(t, len(log)); !reflect.DeepEqual(got, log) {
		t.Fatalf("the hook saw %d events, the log has %d", len(got), len(log))
	}
}

func TestWatchEventsEndsWithItsContext(t *testing.T) {
	lc, err := lifecycle.New(chain("lock"))
	if err != nil {
		t.Fatal(err)
	}
	mustStart(t, lc) // serving: more events may come, so the channel stays open
	ctx, cancel := context.WithCancel(context.Background())
	ch := lc.WatchEvents(ctx, 0)
	for range 4 { // starting, lock running, lock succeeded, serving
		<-ch
	}
	cancel()
	if e, ok := <-ch; ok {
		t.Fatalf("received %v after cancel, want the channel closed", e)
	}
	mustDrain(t, lc)
}
