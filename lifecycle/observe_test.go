package lifecycle_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

func TestBackgroundWorkDoesNotGateServingAndIsCancelledOnDrain(t *testing.T) {
	taskStarted := make(chan struct{})
	var taskCtxErr atomic.Value
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "reclaim", Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.Defer("reclaim-rest", func(ctx context.Context, p *lifecycle.Progress) error {
				p.SetTotal(100, "namespaces")
				p.Add(40)
				close(taskStarted)
				<-ctx.Done()
				taskCtxErr.Store(ctx.Err())
				return ctx.Err()
			})
			return nil
		}},
		{Name: "serve", DependsOn: []string{"reclaim"}, Run: nop},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-taskStarted
	s := lc.Snapshot()
	if s.State != lifecycle.StateServing || len(s.Tasks) != 1 {
		t.Fatalf("state %s tasks %+v, want serving with one task", s.State, s.Tasks)
	}
	task := s.Tasks[0]
	if task.Name != "reclaim-rest" || task.Phase != "reclaim" || task.State != lifecycle.TaskRunning ||
		task.Progress.String() != "40/100 namespaces" {
		t.Fatalf("task %+v", task)
	}
	if err := lc.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(taskCtxErr.Load().(error), context.Canceled) {
		t.Fatalf("task ctx err %v, want cancelled", taskCtxErr.Load())
	}
	s = lc.Snapshot()
	if s.Tasks[0].State != lifecycle.TaskCancelled || s.Degraded {
		t.Fatalf("task %s degraded %v, want cancelled and not degraded", s.Tasks[0].State, s.Degraded)
	}
}

func TestFailedBackgroundTaskDegrades(t *testing.T) {
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "populate", Run: func(ctx context.Context, p *lifecycle.Progress) error {
		p.Defer("fill", func(context.Context, *lifecycle.Progress) error { return errors.New("out of addresses") })
		return nil
	}}})
	if err != nil {
		t.Fatal(err)
	}
	ch, cancel := lc.Subscribe()
	defer cancel()
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case s := <-ch:
			if !s.Degraded {
				continue
			}
			if s.State != lifecycle.StateServing || s.Tasks[0].State != lifecycle.TaskFailed || s.Tasks[0].Err.Error() != "out of addresses" {
				t.Fatalf("degraded snapshot %+v", s)
			}
			_ = lc.Drain(context.Background())
			return
		case <-deadline:
			t.Fatal("lifecycle never became degraded")
		}
	}
}

func TestTasksOfAFailedAttemptNeverRun(t *testing.T) {
	var ran atomic.Bool
	var calls atomic.Int32
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name:  "populate",
		Retry: lifecycle.RetryPolicy{Attempts: 2, Backoff: time.Millisecond},
		Run: func(ctx context.Context, p *lifecycle.Progress) error {
			if calls.Add(1) == 1 {
				p.Defer("doomed", func(context.Context, *lifecycle.Progress) error { ran.Store(true); return nil })
				return errors.New("first attempt fails")
			}
			return nil
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := lc.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ran.Load() || len(lc.Snapshot().Tasks) != 0 {
		t.Fatal("a task deferred by a failed attempt ran")
	}
}

func TestObserverSeesEveryChangeInOrderWhileKeepingUp(t *testing.T) {
	// Each phase, and the stop function, waits until the observer has seen
	// it running (draining): the observer keeps up by construction, so it
	// must see every state.
	seen := map[string]chan struct{}{
		"lock": make(chan struct{}), "listen": make(chan struct{}), "drain": make(chan struct{}),
		"created": make(chan struct{}), "serving": make(chan struct{}),
	}
	waitSeen := func(key string) func(context.Context, *lifecycle.Progress) error {
		return func(ctx context.Context, _ *lifecycle.Progress) error {
			select {
			case <-seen[key]:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: waitSeen("lock"), Stop: func(ctx context.Context) error { return waitSeen("drain")(ctx, nil) }},
		{Name: "listen", DependsOn: []string{"lock"}, Run: waitSeen("listen")},
	}, lifecycle.WithStopTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ch, cancel := lc.Subscribe()
	out := make(chan observed)
	go func() { out <- observe(t, ch, seen) }()
	<-seen["created"]
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-seen["serving"]
	if err := lc.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	cancel()
	h := <-out
	wantStates := []lifecycle.State{lifecycle.StateCreated, lifecycle.StateStarting, lifecycle.StateServing, lifecycle.StateDraining, lifecycle.StateStopped}
	if !slices.Equal(h.states, wantStates) {
		t.Errorf("lifecycle states %v, want %v", h.states, wantStates)
	}
	wantPhase := []lifecycle.PhaseState{lifecycle.PhasePending, lifecycle.PhaseRunning, lifecycle.PhaseSucceeded}
	for name, got := range h.phases {
		if !slices.Equal(got, wantPhase) {
			t.Errorf("phase %s states %v, want %v", name, got, wantPhase)
		}
	}
}

// observed is what an observer saw: each state of the lifecycle and of
// each phase once, in order.
type observed struct {
	states []lifecycle.State
	phases map[string][]lifecycle.PhaseState
}

// observe reads ch to its end, closing seen's channel for a state or a
// phase the first time it sees the lifecycle in that state (created,
// serving, "drain" for draining) or the phase running.
func observe(t *testing.T, ch <-chan lifecycle.Snapshot, seen map[string]chan struct{}) observed {
	h := observed{phases: map[string][]lifecycle.PhaseState{}}
	var last uint64
	for s := range ch {
		if s.Seq < last {
			t.Errorf("seq went back from %d to %d", last, s.Seq)
		}
		last = s.Seq
		if n := len(h.states); n == 0 || h.states[n-1] != s.State {
			h.states = append(h.states, s.State)
			switch s.State {
			case lifecycle.StateCreated:
				close(seen["created"])
			case lifecycle.StateServing:
				close(seen["serving"])
			case lifecycle.StateDraining:
				close(seen["drain"])
			}
		}
		for _, p := range s.Phases {
			ps := h.phases[p.Name]
			if n := len(ps); n == 0 || ps[n-1] != p.State {
				h.phases[p.Name] = append(ps, p.State)
				if p.State == lifecycle.PhaseRunning {
					close(seen[p.Name])
				}
			}
		}
	}
	return h
}

func TestSlowObserverNeitherBlocksNorSeesStaleState(t *testing.T) {
	var phases []lifecycle.Phase
	for _, name := range []string{"a", "b", "c", "d", "e", "f"} {
		phases = append(phases, lifecycle.Phase{Name: name, Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(1000, "items")
			for range 1000 {
				p.Add(1)
			}
			return nil
		}})
	}
	lc, err := lifecycle.New(phases, lifecycle.WithProgressInterval(time.Microsecond))
	if err != nil {
		t.Fatal(err)
	}
	ch, cancel := lc.Subscribe() // never read during the start
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- lc.Start(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Start blocked on an observer that does not read")
	}
	// The one value waiting is the newest, not the first one missed.
	got := <-ch
	want := lc.Snapshot()
	if got.Seq != want.Seq || got.State != lifecycle.StateServing {
		t.Fatalf("slow observer got seq %d state %s, want seq %d serving", got.Seq, got.State, want.Seq)
	}
	// It missed the transitions as states, not as history.
	if len(got.History) != 2 || got.History[0].State != lifecycle.StateStarting || got.History[1].State != lifecycle.StateServing ||
		got.History[1].At.Before(got.History[0].At) {
		t.Fatalf("history %v, want starting then serving", got.History)
	}
	for _, p := range got.Phases {
		if p.Progress.Done != 1000 {
			t.Fatalf("phase %s progress %s, want 1000/1000", p.Name, p.Progress)
		}
	}
	_ = lc.Drain(context.Background())
}

func TestProgressIsThrottledButTheLastReportArrives(t *testing.T) {
	release := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "reclaim", Run: func(ctx context.Context, p *lifecycle.Progress) error {
		p.SetTotal(5000, "namespaces")
		for range 1200 {
			p.Add(1)
		}
		p.SetMessage("waiting for host links")
		<-release
		return nil
	}}}, lifecycle.WithProgressInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ch, cancel := lc.Subscribe()
	defer cancel()
	go func() { _ = lc.Start(context.Background()) }()
	updates := 0
	deadline := time.After(10 * time.Second)
	for {
		select {
		case s := <-ch:
			updates++
			p, _ := s.Phase("reclaim")
			if p.Progress.String() != "1200/5000 namespaces: waiting for host links" {
				continue
			}
			// 1,202 reports reached the observer as a handful of snapshots.
			if updates > 100 {
				t.Fatalf("%d snapshots for 1202 progress reports: not throttled", updates)
			}
			close(release)
			_ = lc.Drain(context.Background())
			return
		case <-deadline:
			t.Fatal("the last progress report never reached the observer")
		}
	}
}

func TestWarningsAreSetReplacedAndCleared(t *testing.T) {
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "only", Run: func(context.Context, *lifecycle.Progress) error { return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		var out []string
		for _, w := range lc.Snapshot().Warnings {
			out = append(out, w.Name+"="+w.Message)
		}
		return out
	}
	lc.Warn("egress", "ip_forward is 0")
	lc.Warn("leases", "2 lost")
	seq := lc.Snapshot().Seq
	lc.Warn("egress", "ip_forward is 0") // same message: no change published
	if got := lc.Snapshot().Seq; got != seq {
		t.Errorf("the same warning again published a change (seq %d -> %d)", seq, got)
	}
	held := lc.Snapshot()
	lc.Warn("egress", "FORWARD policy drop")
	lc.Warn("", "ignored")
	if got, want := names(), []string{"egress=FORWARD policy drop", "leases=2 lost"}; !slices.Equal(got, want) {
		t.Fatalf("warnings %v, want %v", got, want)
	}
	if held.Warnings[0].Message != "ip_forward is 0" {
		t.Fatalf("a snapshot taken earlier changed: %v", held.Warnings)
	}
	lc.ClearWarning("egress")
	lc.ClearWarning("absent")
	if got, want := names(), []string{"leases=2 lost"}; !slices.Equal(got, want) {
		t.Fatalf("after clearing: %v, want %v", got, want)
	}
}
