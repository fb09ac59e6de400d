package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// seqLog records what phases did, ordered by a logical clock rather than
// wall time, so order assertions hold on any machine.
type seqLog struct {
	clock  atomic.Int64
	mu     sync.Mutex
	starts map[string]int64
	ends   map[string]int64
	events []string
}

func newSeqLog() *seqLog {
	return &seqLog{starts: map[string]int64{}, ends: map[string]int64{}}
}

func (l *seqLog) add(event string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, event)
}

func (l *seqLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// phase returns a Run function that records its start and end around body.
func (l *seqLog) phase(name string, body func(ctx context.Context) error) func(context.Context, *lifecycle.Progress) error {
	return func(ctx context.Context, _ *lifecycle.Progress) error {
		l.mu.Lock()
		l.starts[name] = l.clock.Add(1)
		l.mu.Unlock()
		err := body(ctx)
		l.mu.Lock()
		l.ends[name] = l.clock.Add(1)
		l.mu.Unlock()
		return err
	}
}

// randomDAG declares n phases where each may depend on any earlier one.
func randomDAG(r *rand.Rand, n int, body func(name string) func(context.Context, *lifecycle.Progress) error) []lifecycle.Phase {
	phases := make([]lifecycle.Phase, n)
	for i := range phases {
		name := fmt.Sprintf("p%02d", i)
		var deps []string
		for j := range i {
			if r.IntN(4) == 0 {
				deps = append(deps, fmt.Sprintf("p%02d", j))
			}
		}
		phases[i] = lifecycle.Phase{Name: name, DependsOn: deps, Run: body(name)}
	}
	// Shuffle the declaration so that order and dependency are unrelated.
	r.Shuffle(n, func(i, j int) { phases[i], phases[j] = phases[j], phases[i] })
	return phases
}

func TestDependencyOrderHoldsUnderRandomDelays(t *testing.T) {
	for round := range 60 {
		r := rand.New(rand.NewPCG(uint64(round), 7))
		log := newSeqLog()
		phases := randomDAG(r, 12, func(name string) func(context.Context, *lifecycle.Progress) error {
			d := time.Duration(r.IntN(300)) * time.Microsecond
			return log.phase(name, func(context.Context) error { time.Sleep(d); return nil })
		})
		lc, err := lifecycle.New(phases, lifecycle.WithMaxParallel(r.IntN(4)))
		if err != nil {
			t.Fatal(err)
		}
		if err := lc.Start(context.Background()); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, p := range phases {
			for _, d := range p.DependsOn {
				if log.starts[p.Name] <= log.ends[d] {
					t.Fatalf("round %d: %s started at %d before its dependency %s ended at %d",
						round, p.Name, log.starts[p.Name], d, log.ends[d])
				}
			}
		}
		if got := len(log.ends); got != len(phases) {
			t.Fatalf("round %d: %d phases ran, want %d", round, got, len(phases))
		}
		if err := lc.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestIndependentPhasesOverlap(t *testing.T) {
	// Each of a and b waits until the other has started: this completes only
	// if they run at the same time.
	aStarted, bStarted := make(chan struct{}), make(chan struct{})
	meet := func(mine, theirs chan struct{}) func(context.Context, *lifecycle.Progress) error {
		return func(ctx context.Context, _ *lifecycle.Progress) error {
			close(mine)
			select {
			case <-theirs:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: nop},
		{Name: "listen", DependsOn: []string{"lock"}, Run: meet(aStarted, bStarted), Timeout: 10 * time.Second},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: meet(bStarted, aStarted), Timeout: 10 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatalf("independent phases did not overlap: %v", err)
	}
	_ = lc.Drain(context.Background())
}

func TestMaxParallelAndDeclarationOrder(t *testing.T) {
	for _, limit := range []int{1, 2, 3} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			var running, peak atomic.Int64
			log := newSeqLog()
			var phases []lifecycle.Phase
			for i := range 8 {
				name := fmt.Sprintf("p%d", i)
				phases = append(phases, lifecycle.Phase{Name: name, Run: func(context.Context, *lifecycle.Progress) error {
					log.add(name)
					n := running.Add(1)
					for {
						p := peak.Load()
						if n <= p || peak.CompareAndSwap(p, n) {
							break
						}
					}
					time.Sleep(time.Millisecond)
					running.Add(-1)
					return nil
				}})
			}
			lc, err := lifecycle.New(phases, lifecycle.WithMaxParallel(limit))
			if err != nil {
				t.Fatal(err)
			}
			if err := lc.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			if p := peak.Load(); p > int64(limit) {
				t.Fatalf("%d phases ran at once, limit %d", p, limit)
			}
			if limit == 1 {
				want := []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"}
				if got := log.list(); !slices.Equal(got, want) {
					t.Fatalf("start order %v, want declaration order %v", got, want)
				}
			}
		})
	}
}

func TestAttemptTimeout(t *testing.T) {
	var attempts atomic.Int32
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name:    "reclaim",
		Timeout: 20 * time.Millisecond,
		Retry:   lifecycle.RetryPolicy{Attempts: 2, Backoff: time.Millisecond},
		Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			attempts.Add(1)
			<-ctx.Done()
			return ctx.Err()
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	err = lc.Start(context.Background())
	var pe *lifecycle.PhaseError
	var te *lifecycle.AttemptTimeoutError
	switch {
	case !errors.As(err, &pe) || pe.Phase != "reclaim" || pe.Attempts != 2:
		t.Fatalf("err = %v, want a PhaseError for reclaim after 2 attempts", err)
	case !errors.As(err, &te) || te.Attempt != 2 || te.Timeout != 20*time.Millisecond:
		t.Fatalf("err = %v, want an AttemptTimeoutError for attempt 2", err)
	case !errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("err = %v does not wrap context.DeadlineExceeded", err)
	case err.Error() != `phase "reclaim" failed after 2 attempts: attempt 2 timed out after 20ms`:
		t.Fatalf("message = %q", err)
	case attempts.Load() != 2:
		t.Fatalf("Run called %d times, want 2", attempts.Load())
	}
	if s := lc.State(); s != lifecycle.StateFailed {
		t.Fatalf("state = %s, want failed", s)
	}
}

func TestRetries(t *testing.T) {
	errFlaky := errors.New("device busy")
	tests := []struct {
		name         string
		policy       lifecycle.RetryPolicy
		failures     int  // attempts that fail before one succeeds
		permanent    bool // failures are marked permanent
		wantAttempts int
		wantErr      string
	}{
		{"no policy runs once", lifecycle.RetryPolicy{}, 1, false, 1, `phase "storage" failed after 1 attempt: device busy`},
		{"succeeds on third", lifecycle.RetryPolicy{Attempts: 3, Backoff: time.Millisecond}, 2, false, 3, ""},
		{"runs out", lifecycle.RetryPolicy{Attempts: 3, Backoff: time.Millisecond}, 5, false, 3, `phase "storage" failed after 3 attempts: device busy`},
		{"permanent is not retried", lifecycle.RetryPolicy{Attempts: 5, Backoff: time.Millisecond}, 5, true, 1, `phase "storage" failed after 1 attempt: device busy`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			lc, err := lifecycle.New([]lifecycle.Phase{{
				Name:  "storage",
				Retry: tc.policy,
				Run: func(context.Context, *lifecycle.Progress) error {
					if int(calls.Add(1)) <= tc.failures {
						if tc.permanent {
							return lifecycle.Permanent(errFlaky)
						}
						return errFlaky
					}
					return nil
				},
			}})
			if err != nil {
				t.Fatal(err)
			}
			states, stop := collectPhaseStates(lc, "storage")
			err = lc.Start(context.Background())
			got := stop()
			if int(calls.Load()) != tc.wantAttempts {
				t.Errorf("Run called %d times, want %d", calls.Load(), tc.wantAttempts)
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
			} else if err == nil || err.Error() != tc.wantErr || !errors.Is(err, errFlaky) {
				t.Fatalf("err = %v, want %q wrapping the cause", err, tc.wantErr)
			}
			snap, _ := lc.Snapshot().Phase("storage")
			if snap.Attempts != tc.wantAttempts {
				t.Errorf("snapshot attempts = %d, want %d", snap.Attempts, tc.wantAttempts)
			}
			if tc.wantAttempts > 1 && !slices.Contains(got, lifecycle.PhaseRetrying) {
				t.Errorf("states %v never show retrying", got)
			}
			_ = states
		})
	}
}

// collectPhaseStates records every state the named phase is seen in, from
// an observer that keeps up.
func collectPhaseStates(lc *lifecycle.Lifecycle, name string) (chan struct{}, func() []lifecycle.PhaseState) {
	ch, cancel := lc.Subscribe()
	done := make(chan struct{})
	var got []lifecycle.PhaseState
	go func() {
		defer close(done)
		for s := range ch {
			p, _ := s.Phase(name)
			if len(got) == 0 || got[len(got)-1] != p.State {
				got = append(got, p.State)
			}
		}
	}()
	return done, func() []lifecycle.PhaseState {
		cancel()
		<-done
		return got
	}
}

func TestFailureCancelsSkipsAndRollsBack(t *testing.T) {
	log := newSeqLog()
	stop := func(name string) func(context.Context) error {
		return func(context.Context) error { log.add("stop " + name); return nil }
	}
	bStarted := make(chan struct{})
	phases := []lifecycle.Phase{
		{Name: "lock", Run: nop, Stop: stop("lock")},
		{Name: "listen", DependsOn: []string{"lock"}, Run: nop, Stop: stop("listen")},
		{Name: "reclaim", DependsOn: []string{"lock"}, Stop: stop("reclaim"), Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			close(bStarted)
			<-ctx.Done() // a long reclaim, cancelled by the sibling's failure
			log.add("reclaim cancelled: " + context.Cause(ctx).Error())
			return ctx.Err()
		}},
		{Name: "register", DependsOn: []string{"listen"}, Stop: stop("register"), Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			<-bStarted
			return lifecycle.Permanent(errors.New("bad certificate"))
		}},
		{Name: "populate", DependsOn: []string{"reclaim"}, Run: nop, Stop: stop("populate")},
		{Name: "serve", DependsOn: []string{"register", "populate"}, Run: nop, Stop: stop("serve")},
	}
	lc, err := lifecycle.New(phases)
	if err != nil {
		t.Fatal(err)
	}
	err = lc.Start(context.Background())
	var pe *lifecycle.PhaseError
	if !errors.As(err, &pe) || pe.Phase != "register" || err.Error() != `phase "register" failed after 1 attempt: bad certificate` {
		t.Fatalf("err = %v", err)
	}
	s := lc.Snapshot()
	want := map[string]lifecycle.PhaseState{
		"lock": lifecycle.PhaseSucceeded, "listen": lifecycle.PhaseSucceeded,
		"reclaim": lifecycle.PhaseCancelled, "register": lifecycle.PhaseFailed,
		"populate": lifecycle.PhaseSkipped, "serve": lifecycle.PhaseSkipped,
	}
	for _, p := range s.Phases {
		if p.State != want[p.Name] {
			t.Errorf("phase %s is %s, want %s", p.Name, p.State, want[p.Name])
		}
	}
	if s.State != lifecycle.StateFailed || s.Err == nil {
		t.Fatalf("lifecycle %s (err %v), want failed", s.State, s.Err)
	}
	wantLog := []string{
		`reclaim cancelled: phase "register" failed after 1 attempt: bad certificate`,
		"stop listen",
		"stop lock",
	}
	if got := log.list(); !slices.Equal(got, wantLog) {
		t.Fatalf("log %q, want %q", got, wantLog)
	}
	// Draining a failed lifecycle stops it without running any stop twice.
	if err := lc.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if lc.State() != lifecycle.StateStopped || len(log.list()) != len(wantLog) {
		t.Fatalf("after drain: %s, log %q", lc.State(), log.list())
	}
}

func TestRollbackOrderIsReverseDependencyOrder(t *testing.T) {
	for round := range 30 {
		r := rand.New(rand.NewPCG(uint64(round), 11))
		log := newSeqLog()
		var phases []lifecycle.Phase
		phases = randomDAG(r, 10, func(name string) func(context.Context, *lifecycle.Progress) error {
			d := time.Duration(r.IntN(200)) * time.Microsecond
			return func(context.Context, *lifecycle.Progress) error { time.Sleep(d); return nil }
		})
		stopped := map[string]int{}
		for i := range phases {
			name := phases[i].Name
			phases[i].Stop = func(context.Context) error {
				log.mu.Lock()
				stopped[name] = len(stopped)
				log.mu.Unlock()
				return nil
			}
		}
		lc, err := lifecycle.New(phases)
		if err != nil {
			t.Fatal(err)
		}
		if err := lc.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := lc.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, p := range phases {
			for _, d := range p.DependsOn {
				if stopped[p.Name] >= stopped[d] {
					t.Fatalf("round %d: %s (depends on %s) stopped after it", round, p.Name, d)
				}
			}
		}
	}
}

func TestStartHonoursContext(t *testing.T) {
	started := make(chan struct{})
	var stopped atomic.Bool
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: nop, Stop: func(context.Context) error { stopped.Store(true); return nil }},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	err = lc.Start(ctx)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "start cancelled") {
		t.Fatalf("err = %v, want start cancelled", err)
	}
	if lc.State() != lifecycle.StateFailed || !stopped.Load() {
		t.Fatalf("state %s, lock stopped %v; want failed and rolled back", lc.State(), stopped.Load())
	}
	p, _ := lc.Snapshot().Phase("reclaim")
	if p.State != lifecycle.PhaseCancelled {
		t.Fatalf("reclaim %s, want cancelled", p.State)
	}
}

func TestPanicInRunIsAnError(t *testing.T) {
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "lock", Run: func(context.Context, *lifecycle.Progress) error {
		panic("boom")
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err == nil || err.Error() != `phase "lock" failed after 1 attempt: panic: boom` {
		t.Fatalf("err = %v", err)
	}
}

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

func TestFailFromServing(t *testing.T) {
	var stopped atomic.Bool
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "lock", Run: nop, Stop: func(context.Context) error { stopped.Store(true); return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Fail(errors.New("x")); err == nil {
		t.Fatal("Fail from created was accepted")
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := lc.Fail(errors.New("reconciler died")); err != nil {
		t.Fatal(err)
	}
	if s := lc.Snapshot(); s.State != lifecycle.StateFailed || s.Err.Error() != "reconciler died" {
		t.Fatalf("state %s err %v", s.State, s.Err)
	}
	if err := lc.Drain(context.Background()); err != nil || !stopped.Load() || lc.State() != lifecycle.StateStopped {
		t.Fatalf("drain %v stopped %v state %s", err, stopped.Load(), lc.State())
	}
}
