package lifecycle_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

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

// eventLogCase is a run of a lifecycle and the event log it must leave.
type eventLogCase struct {
	name   string
	phases func() ([]lifecycle.Phase, chan struct{})
	drive  func(t *testing.T, lc *lifecycle.Lifecycle, running chan struct{})
	final  bool // the log ends with stopped
	want   []string
}

func TestEventsRecordEveryTransitionOnceInOrder(t *testing.T) {
	for _, tc := range slices.Concat(startEventCases(), stopEventCases()) {
		t.Run(tc.name, func(t *testing.T) { checkEventLog(t, tc) })
	}
}

// errBusy is the error of a phase's first attempt that is retried.
var errBusy = errors.New("device busy")

// blockUntilCancelled is a phase's Run that closes running once it runs and
// returns when cancelled.
func blockUntilCancelled(running chan struct{}) func(context.Context, *lifecycle.Progress) error {
	return func(ctx context.Context, _ *lifecycle.Progress) error {
		close(running)
		<-ctx.Done()
		return ctx.Err()
	}
}

// startEventCases are the runs whose start ends: served, retried, failed.
func startEventCases() []eventLogCase {
	return []eventLogCase{
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
	}
}

// stopEventCases are the runs that end otherwise: a drain during the
// start, a fault while serving, warnings.
func stopEventCases() []eventLogCase {
	return []eventLogCase{
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
}

// checkEventLog runs tc and checks the log, and that the hook, a watcher
// from the beginning and one resuming from the middle saw exactly it.
func checkEventLog(t *testing.T, tc eventLogCase) {
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
	// The task's function has returned; its failure is recorded just
	// after: a drain before that would cancel it instead.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if ts := lc.Snapshot().Tasks; len(ts) == 1 && ts[0].State == lifecycle.TaskFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the task's failure was not recorded: %+v", lc.Snapshot().Tasks)
		}
	}
	mustDrain(t, lc)
	log := lc.Events(0)
	checkDense(t, log)
	succeeded := map[string]uint64{}
	var task []string
	for _, e := range log {
		switch e.Kind {
		case lifecycle.EventPhase:
			if e.To == lifecycle.PhaseRunning {
				for _, d := range e.DependsOn {
					if succeeded[d] == 0 {
						t.Errorf("%v: dependency %s had not succeeded", e, d)
					}
				}
			}
			if e.To == lifecycle.PhaseSucceeded {
				succeeded[e.Name] = e.Seq
			}
		case lifecycle.EventTask:
			from := "" // a task's first event has none
			if e.From != nil {
				from = e.From.String()
			}
			task = append(task, fmt.Sprintf("%s %s→%s (%s) %s", e.Name, from, e.To, e.Phase, e.Err))
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
		Name: "reclaim", From: lifecycle.PhaseRunning, To: lifecycle.PhaseRetrying, Attempt: 1, Err: "device busy",
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
	b, _ = json.Marshal(lifecycle.Event{Seq: 1, Time: e.Time, Kind: lifecycle.EventLifecycle, From: lifecycle.StateCreated, To: lifecycle.StateStarting})
	if got := string(b); got != `{"seq":1,"time":"2026-11-30T12:00:00Z","kind":"lifecycle","from":"created","to":"starting"}` {
		t.Fatalf("fields that do not apply are not left out: %s", got)
	}
}
