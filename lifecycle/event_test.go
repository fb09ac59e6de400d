package lifecycle_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
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

// describe renders events without their sequence numbers and times, which
// checkDense checks on their own.
func describe(events []lifecycle.Event) []string {
	out := make([]string, len(events))
	for i, e := range events {
		_, out[i], _ = strings.Cut(e.String(), " ")
	}
	return out
}

// checkDense checks that events are numbered 1, 2, 3, ... and that their
// times never go back.
func checkDense(t *testing.T, events []lifecycle.Event) {
	t.Helper()
	for i, e := range events {
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d: %v", i, e.Seq, events)
		}
		if i > 0 && e.Time.Before(events[i-1].Time) {
			t.Fatalf("event %v is timed before the one it follows, %v", e, events[i-1])
		}
	}
}

// watchAll collects WatchEvents(ctx, after) until the channel closes.
func watchAll(ctx context.Context, lc *lifecycle.Lifecycle, after uint64) []lifecycle.Event {
	var out []lifecycle.Event
	for e := range lc.WatchEvents(ctx, after) {
		out = append(out, e)
	}
	return out
}

func chain(names ...string) []lifecycle.Phase {
	var phases []lifecycle.Phase
	for i, n := range names {
		p := lifecycle.Phase{Name: n, Run: nop}
		if i > 0 {
			p.DependsOn = []string{names[i-1]}
		}
		phases = append(phases, p)
	}
	return phases
}

func TestEventsRecordEveryTransitionOnceInOrder(t *testing.T) {
	errBusy := errors.New("device busy")
	blockUntilCancelled := func(running chan struct{}) func(context.Context, *lifecycle.Progress) error {
		return func(ctx context.Context, _ *lifecycle.Progress) error {
			close(running)
			<-ctx.Done()
			return ctx.Err()
		}
	}
	tests := []struct {
		name   string
		phases func() ([]lifecycle.Phase, chan struct{})
		drive  func(t *testing.T, lc *lifecycle.Lifecycle, running chan struct{})
		final  bool // the log ends with stopped
		want   []string
	}{
		{
			name:   "serves and drains",
			phases: func() ([]lifecycle.Phase, chan struct{}) { return chain("lock", "listen"), nil },
			drive: func(t *testing.T, lc *lifecycle.Lifecycle, _ chan struct{}) {
				mustStart(t, lc)
				mustDrain(t, lc)
			},
			final: true,
			want: []string{
				"lifecycle created→starting",
				"phase lock pending→running (attempt 1)",
				"phase lock running→succeeded (attempt 1)",
				"phase listen pending→running (attempt 1)",
				"phase listen running→succeeded (attempt 1)",
				"lifecycle starting→serving",
				"lifecycle serving→draining",
				"lifecycle draining→stopped",
			},
		},
		{
			name: "retries then succeeds",
			phases: func() ([]lifecycle.Phase, chan struct{}) {
				var calls atomic.Int32
				return []lifecycle.Phase{{Name: "storage", Retry: lifecycle.RetryPolicy{Attempts: 3},
					Run: func(context.Context, *lifecycle.Progress) error {
						if calls.Add(1) == 1 {
							return errBusy
						}
						return nil
					}}}, nil
			},
			drive: func(t *testing.T, lc *lifecycle.Lifecycle, _ chan struct{}) {
				mustStart(t, lc)
				mustDrain(t, lc)
			},
			final: true,
			want: []string{
				"lifecycle created→starting",
				"phase storage pending→running (attempt 1)",
				"phase storage running→retrying (attempt 1): device busy",
				"phase storage retrying→running (attempt 2)",
				"phase storage running→succeeded (attempt 2)",
				"lifecycle starting→serving",
				"lifecycle serving→draining",
				"lifecycle draining→stopped",
			},
		},
		{
			name: "a failure skips the rest and fails the start",
			phases: func() ([]lifecycle.Phase, chan struct{}) {
				p := chain("lock", "register", "serve")
				p[1].Run = func(context.Context, *lifecycle.Progress) error {
					return lifecycle.Permanent(errors.New("bad certificate"))
				}
				return p, nil
			},
			drive: func(t *testing.T, lc *lifecycle.Lifecycle, _ chan struct{}) {
				if err := lc.Start(context.Background()); err == nil {
					t.Fatal("start succeeded")
				}
				mustDrain(t, lc)
			},
			final: true,
			want: []string{
				"lifecycle created→starting",
				"phase lock pending→running (attempt 1)",
				"phase lock running→succeeded (attempt 1)",
				"phase register pending→running (attempt 1)",
				"phase register running→failed (attempt 1): bad certificate",
				"phase serve pending→skipped",
				`lifecycle starting→failed: phase "register" failed after 1 attempt: bad certificate`,
				"lifecycle failed→stopped",
			},
		},
		{
			name: "a drain during the start cancels it",
			phases: func() ([]lifecycle.Phase, chan struct{}) {
				running := make(chan struct{})
				p := chain("reclaim", "serve")
				p[0].Run = blockUntilCancelled(running)
				return p, running
			},
			drive: func(t *testing.T, lc *lifecycle.Lifecycle, running chan struct{}) {
				started := make(chan error, 1)
				go func() { started <- lc.Start(context.Background()) }()
				<-running
				mustDrain(t, lc)
				if err := <-started; !errors.Is(err, lifecycle.ErrClosed) {
					t.Fatalf("Start = %v, want ErrClosed", err)
				}
			},
			final: true,
			want: []string{
				"lifecycle created→starting",
				"phase reclaim pending→running (attempt 1)",
				"lifecycle starting→draining",
				"phase reclaim running→cancelled (attempt 1): lifecycle: drained during the start (last error: context canceled)",
				"phase serve pending→skipped",
				"lifecycle draining→stopped",
			},
		},
		{
			name:   "a fault while serving",
			phases: func() ([]lifecycle.Phase, chan struct{}) { return chain("lock"), nil },
			drive: func(t *testing.T, lc *lifecycle.Lifecycle, _ chan struct{}) {
				mustStart(t, lc)
				if err := lc.Fail(errors.New("reconciler died")); err != nil {
					t.Fatal(err)
				}
				mustDrain(t, lc)
			},
			final: true,
			want: []string{
				"lifecycle created→starting",
				"phase lock pending→running (attempt 1)",
				"phase lock running→succeeded (attempt 1)",
				"lifecycle starting→serving",
				"lifecycle serving→failed: reconciler died",
				"lifecycle failed→stopped",
			},
		},
		{
			name:   "warnings, and nothing after a drain before the start",
			phases: func() ([]lifecycle.Phase, chan struct{}) { return chain("lock"), nil },
			drive: func(t *testing.T, lc *lifecycle.Lifecycle, _ chan struct{}) {
				lc.Warn("egress", "ip_forward is 0")
				lc.Warn("egress", "ip_forward is 0") // no change, no event
				lc.Warn("egress", "FORWARD policy drop")
				lc.ClearWarning("absent")
				lc.ClearWarning("egress")
				mustDrain(t, lc)
				lc.Warn("late", "ignored once the lifecycle is over")
			},
			want: []string{
				"warning-set egress: ip_forward is 0",
				"warning-set egress: FORWARD policy drop",
				"warning-cleared egress: FORWARD policy drop",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			phases, running := tc.phases()
			hook := newHookRecorder(0)
			lc, err := lifecycle.New(phases, lifecycle.WithMaxParallel(1), lifecycle.WithEventHook(hook.record))
			if err != nil {
				t.Fatal(err)
			}
			// A watcher from the very beginning, reading as events come.
			watched := make(chan []lifecycle.Event, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { watched <- watchAll(ctx, lc, 0) }()

			tc.drive(t, lc, running)

			log := lc.Events(0)
			checkDense(t, log)
			if got := describe(log); !slices.Equal(got, tc.want) {
				t.Fatalf("events:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
			if got := log[len(log)-1].Final(); got != tc.final {
				t.Fatalf("last event %v: Final() = %v, want %v", log[len(log)-1], got, tc.final)
			}
			// The hook and the watcher saw exactly the log.
			if got := hook.waitFor(t, len(log)); !reflect.DeepEqual(got, log) {
				t.Fatalf("the hook saw\n%v\nthe log is\n%v", got, log)
			}
			// Every run here ends the log, final event or not: the watcher's
			// channel closes by itself.
			if got := <-watched; !reflect.DeepEqual(got, log) {
				t.Fatalf("the watcher saw\n%v\nthe log is\n%v", got, log)
			}
			// Resuming from the middle yields exactly the rest.
			mid := uint64(len(log) / 2)
			if got := watchAll(context.Background(), lc, mid); !reflect.DeepEqual(got, log[mid:]) {
				t.Fatalf("resumed after %d: %v, want %v", mid, got, log[mid:])
			}
			if got := lc.Events(mid); !reflect.DeepEqual(got, log[mid:]) {
				t.Fatalf("Events(%d) = %v, want %v", mid, got, log[mid:])
			}
			if got := lc.Events(uint64(len(log))); len(got) != 0 {
				t.Fatalf("Events after the last = %v", got)
			}
			if s := lc.Snapshot(); s.EventSeq != uint64(len(log)) {
				t.Fatalf("snapshot EventSeq %d, want %d", s.EventSeq, len(log))
			}
		})
	}
}

func mustStart(t *testing.T, lc *lifecycle.Lifecycle) {
	t.Helper()
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func mustDrain(t *testing.T, lc *lifecycle.Lifecycle) {
	t.Helper()
	if err := lc.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestEventPhasesCarryDependenciesAndTasks(t *testing.T) {
	taskDone := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: nop},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.Defer("reclaim-rest", func(context.Context, *lifecycle.Progress) error {
				defer close(taskDone)
				return errors.New("3 namespaces still busy")
			})
			return nil
		}},
		{Name: "listen", DependsOn: []string{"lock"}, Run: nop},
		{Name: "serve", DependsOn: []string{"listen", "reclaim"}, Run: nop},
	})
	if err != nil {
		t.Fatal(err)
	}
	mustStart(t, lc)
	<-taskDone
	mustDrain(t, lc)
	log := lc.Events(0)
	checkDense(t, log)
	succeeded := map[string]uint64{}
	var task []string
	for _, e := range log {
		switch e.Kind {
		case lifecycle.EventPhase:
			if e.To == string(lifecycle.PhaseRunning) {
				for _, d := range e.DependsOn {
					if succeeded[d] == 0 {
						t.Errorf("%v: dependency %s had not succeeded", e, d)
					}
				}
			}
			if e.To == string(lifecycle.PhaseSucceeded) {
				succeeded[e.Name] = e.Seq
			}
		case lifecycle.EventTask:
			task = append(task, fmt.Sprintf("%s %s→%s (%s) %s", e.Name, e.From, e.To, e.Phase, e.Err))
		}
	}
	if p, _ := lc.Snapshot().Phase("serve"); !slices.Equal(p.DependsOn, []string{"listen", "reclaim"}) {
		t.Fatalf("serve depends on %v", p.DependsOn)
	}
	want := []string{"reclaim-rest →running (reclaim) ", "reclaim-rest running→failed (reclaim) 3 namespaces still busy"}
	if !slices.Equal(task, want) {
		t.Fatalf("task events %q, want %q", task, want)
	}
}

func TestEventJSONFieldNamesAreStable(t *testing.T) {
	e := lifecycle.Event{
		Seq: 7, Time: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), Kind: lifecycle.EventPhase,
		Name: "reclaim", From: "running", To: "retrying", Attempt: 1, Err: "device busy",
		DependsOn: []string{"lock"}, Phase: "p", Message: "m",
	}
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"seq":7,"time":"2026-11-30T12:00:00Z","kind":"phase","name":"reclaim","from":"running","to":"retrying","attempt":1,"error":"device busy","depends_on":["lock"],"phase":"p","message":"m"}`
	if string(b) != want {
		t.Fatalf("JSON\n%s\nwant\n%s", b, want)
	}
	var back lifecycle.Event
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, e) {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	b, _ = json.Marshal(lifecycle.Event{Seq: 1, Time: e.Time, Kind: lifecycle.EventLifecycle, From: "created", To: "starting"})
	if got := string(b); got != `{"seq":1,"time":"2026-11-30T12:00:00Z","kind":"lifecycle","from":"created","to":"starting"}` {
		t.Fatalf("fields that do not apply are not left out: %s", got)
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
		if e.Name == "reclaim" && e.To == string(lifecycle.PhaseRunning) {
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

func TestDoneErrAndWait(t *testing.T) {
	errFault := errors.New("reconciler died")
	tests := []struct {
		name      string
		phases    []lifecycle.Phase
		drive     func(lc *lifecycle.Lifecycle)
		wantState lifecycle.State
		wantErr   func(error) bool
	}{
		{
			name:      "a clean stop",
			phases:    chain("lock", "serve"),
			drive:     func(lc *lifecycle.Lifecycle) { _ = lc.Start(context.Background()); _ = lc.Drain(context.Background()) },
			wantState: lifecycle.StateStopped,
			wantErr:   func(err error) bool { return err == nil },
		},
		{
			name: "a failed start",
			phases: []lifecycle.Phase{{Name: "lock", Run: func(context.Context, *lifecycle.Progress) error {
				return errors.New("held by pid 42")
			}}},
			drive:     func(lc *lifecycle.Lifecycle) { _ = lc.Start(context.Background()) },
			wantState: lifecycle.StateFailed,
			wantErr: func(err error) bool {
				var pe *lifecycle.PhaseError
				return errors.As(err, &pe) && pe.Phase == "lock"
			},
		},
		{
			name:   "a fault while serving",
			phases: chain("lock"),
			drive: func(lc *lifecycle.Lifecycle) {
				_ = lc.Start(context.Background())
				_ = lc.Fail(errFault)
			},
			wantState: lifecycle.StateFailed,
			wantErr:   func(err error) bool { return err == errFault },
		},
		{
			name:      "a drain before the start",
			phases:    chain("lock"),
			drive:     func(lc *lifecycle.Lifecycle) { _ = lc.Drain(context.Background()) },
			wantState: lifecycle.StateCreated,
			wantErr:   func(err error) bool { return err == nil },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lc, err := lifecycle.New(tc.phases)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-lc.Done():
				t.Fatal("Done closed before anything happened")
			default:
			}
			if lc.Err() != nil {
				t.Fatalf("Err = %v before anything happened", lc.Err())
			}
			tc.drive(lc)
			select {
			case <-lc.Done():
			default:
				t.Fatalf("Done still open in state %s", lc.State())
			}
			if s := lc.State(); s != tc.wantState {
				t.Fatalf("state %s, want %s", s, tc.wantState)
			}
			if err := lc.Wait(context.Background()); !tc.wantErr(err) || !tc.wantErr(lc.Err()) {
				t.Fatalf("Wait = %v, Err = %v", err, lc.Err())
			}
			_ = lc.Drain(context.Background())
			if err := lc.Err(); !tc.wantErr(err) {
				t.Fatalf("after the drain Err = %v: a drain must not change why it failed", err)
			}
		})
	}
	t.Run("serving is not done", func(t *testing.T) {
		lc, err := lifecycle.New(chain("lock"))
		if err != nil {
			t.Fatal(err)
		}
		mustStart(t, lc)
		ctx, cancel := context.WithCancelCause(context.Background())
		cause := errors.New("test over")
		cancel(cause)
		if err := lc.Wait(ctx); err != cause {
			t.Fatalf("Wait on a serving lifecycle = %v, want ctx's cause", err)
		}
		mustDrain(t, lc)
	})
}

// Done closes when the start fails, before its rollback has run; a Drain
// called at once must wait for the rollback instead of running the
// remaining stops beside it, which could stop a dependency before its
// dependent.
func TestDrainOnDoneWaitsForTheRollback(t *testing.T) {
	for range 20 {
		releaseB := make(chan struct{})
		var bDone atomic.Bool
		aCalled := make(chan bool, 1)
		phases := chain("a", "b", "c")
		phases[0].Stop = func(context.Context) error { aCalled <- bDone.Load(); return nil }
		phases[1].Stop = func(context.Context) error { <-releaseB; bDone.Store(true); return nil }
		phases[2].Run = func(context.Context, *lifecycle.Progress) error { return errors.New("boom") }
		lc, err := lifecycle.New(phases)
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan error, 1)
		go func() { started <- lc.Start(context.Background()) }()
		<-lc.Done()
		drained := make(chan error, 1)
		go func() { drained <- lc.Drain(context.Background()) }()
		select {
		case <-aCalled:
			t.Fatal("a drain on Done stopped a while b was still stopping")
		case <-time.After(20 * time.Millisecond): // proves nothing by itself; the release does
		}
		close(releaseB)
		if sawB := <-aCalled; !sawB {
			t.Fatal("a was stopped before b had finished stopping")
		}
		if err := <-started; err == nil {
			t.Fatal("start succeeded")
		}
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
	}
}
