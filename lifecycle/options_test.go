package lifecycle_test

import (
	"context"
	"errors"
	"io/fs"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

func TestStartTimeoutNamesThePhasesStillRunning(t *testing.T) {
	reclaimAt := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: nop, Stop: func(context.Context) error { return nil }},
		{Name: "listen", DependsOn: []string{"lock"}, Run: nop},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(5000, "namespaces")
			p.Add(1200)
			close(reclaimAt)
			<-ctx.Done() // stuck, as on a host where unmount hangs
			return ctx.Err()
		}},
		{Name: "storage", DependsOn: []string{"lock"}, Retry: lifecycle.RetryPolicy{Attempts: 5, Backoff: time.Hour},
			Run: func(context.Context, *lifecycle.Progress) error { <-reclaimAt; return errors.New("EBUSY") }},
		{Name: "serve", DependsOn: []string{"listen", "reclaim", "storage"}, Run: nop},
	}, lifecycle.WithStartTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	err = lc.Start(context.Background())
	var te *lifecycle.StartTimeoutError
	if !errors.As(err, &te) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start = %v, want a *StartTimeoutError wrapping DeadlineExceeded", err)
	}
	// What was running is named, with its progress; what succeeded or had
	// not started is not.
	re := regexp.MustCompile(`^start timed out after 100ms: ` +
		`phase reclaim running for \d+ms at 1200/5000 namespaces; ` +
		`phase storage retrying for \d+ms$`)
	if !re.MatchString(err.Error()) {
		t.Fatalf("message %q does not match %s", err, re)
	}
	if len(te.Running) != 2 || te.Running[0].Progress.Done != 1200 || te.Running[1].State != lifecycle.PhaseRetrying {
		t.Fatalf("running %+v", te.Running)
	}
	if s := lc.Snapshot(); s.State != lifecycle.StateFailed || !errors.As(lc.Err(), &te) {
		t.Fatalf("state %s err %v, want failed with the timeout", s.State, lc.Err())
	}
	p, _ := lc.Snapshot().Phase("serve")
	if p.State != lifecycle.PhaseSkipped {
		t.Fatalf("serve is %s, want skipped", p.State)
	}
	mustDrain(t, lc)
}

func TestStartTimeoutErrorMessage(t *testing.T) {
	tests := []struct {
		err  lifecycle.StartTimeoutError
		want string
	}{
		{
			lifecycle.StartTimeoutError{Timeout: 10 * time.Minute, Running: []lifecycle.RunningPhase{{
				Name: "reclaim", State: lifecycle.PhaseRunning, Attempt: 1, For: 9*time.Minute + 58*time.Second + 312*time.Millisecond,
				Progress: lifecycle.ProgressSnapshot{Done: 1200, Total: 5000, Unit: "namespaces"},
			}}},
			"start timed out after 10m0s: phase reclaim running for 9m58s at 1200/5000 namespaces",
		},
		{
			lifecycle.StartTimeoutError{Timeout: 2 * time.Second, Running: []lifecycle.RunningPhase{
				{Name: "lock", State: lifecycle.PhaseRetrying, Attempt: 3, For: 1540 * time.Millisecond},
				{Name: "listen", State: lifecycle.PhaseRunning, Attempt: 1, For: 3 * time.Millisecond,
					Progress: lifecycle.ProgressSnapshot{Message: "waiting for the socket"}},
			}},
			"start timed out after 2s: phase lock retrying for 1.5s (attempt 3); phase listen running for 3ms at waiting for the socket",
		},
		{lifecycle.StartTimeoutError{Timeout: time.Second}, "start timed out after 1s"},
	}
	for _, tc := range tests {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("got  %q\nwant %q", got, tc.want)
		}
	}
}

func TestZeroStartTimeoutIsNoBound(t *testing.T) {
	lc, err := lifecycle.New(chain("lock"), lifecycle.WithStartTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	mustStart(t, lc)
	mustDrain(t, lc)
}

func TestPanicsCarryTheirStack(t *testing.T) {
	errInner := fs.ErrPermission
	tests := []struct {
		name   string
		phase  func(panicky func()) lifecycle.Phase
		result func(lc *lifecycle.Lifecycle) error
	}{
		{
			name: "run",
			phase: func(panicky func()) lifecycle.Phase {
				return lifecycle.Phase{Name: "lock", Run: func(context.Context, *lifecycle.Progress) error { panicky(); return nil }}
			},
			result: func(lc *lifecycle.Lifecycle) error { return lc.Start(context.Background()) },
		},
		{
			name: "stop",
			phase: func(panicky func()) lifecycle.Phase {
				return lifecycle.Phase{Name: "lock", Run: nop, Stop: func(context.Context) error { panicky(); return nil }}
			},
			result: func(lc *lifecycle.Lifecycle) error {
				if err := lc.Start(context.Background()); err != nil {
					return err
				}
				return lc.Drain(context.Background())
			},
		},
		{
			name: "task",
			phase: func(panicky func()) lifecycle.Phase {
				return lifecycle.Phase{Name: "lock", Run: func(_ context.Context, p *lifecycle.Progress) error {
					p.Defer("fill", func(context.Context, *lifecycle.Progress) error { panicky(); return nil })
					return nil
				}}
			},
			result: func(lc *lifecycle.Lifecycle) error {
				if err := lc.Start(context.Background()); err != nil {
					return err
				}
				if err := lc.Drain(context.Background()); err != nil {
					return err
				}
				return lc.Snapshot().Tasks[0].Err
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lc, err := lifecycle.New([]lifecycle.Phase{tc.phase(panicWithPermission)})
			if err != nil {
				t.Fatal(err)
			}
			err = tc.result(lc)
			var pe *lifecycle.PanicError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v (%T), want a *PanicError", err, err)
			}
			if !errors.Is(err, errInner) || !strings.Contains(err.Error(), "panic: permission denied") {
				t.Fatalf("err = %v, want the panic's error in the chain and the message", err)
			}
			// The stack shows where the panic happened, not only where it
			// was recovered.
			if !strings.Contains(string(pe.Stack), "lifecycle_test.panicWithPermission") {
				t.Fatalf("stack does not name the panicking function:\n%s", pe.Stack)
			}
		})
	}
}

func panicWithPermission() { panic(fs.ErrPermission) }

func TestZeroStopTimeoutMeansNoGrace(t *testing.T) {
	var stopCtxErr error
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "listen", Run: nop, Stop: func(ctx context.Context) error {
		stopCtxErr = ctx.Err() // already over: close connections, do not drain them
		return nil
	}}}, lifecycle.WithStopTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	mustStart(t, lc)
	mustDrain(t, lc)
	if !errors.Is(stopCtxErr, context.DeadlineExceeded) {
		t.Fatalf("the stop's ctx had err %v, want it already past its deadline", stopCtxErr)
	}
}

func TestZeroProgressIntervalPublishesEveryReport(t *testing.T) {
	release := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "reclaim", Run: func(ctx context.Context, p *lifecycle.Progress) error {
		<-release
		for range 50 {
			p.Add(1)
		}
		return nil
	}}}, lifecycle.WithProgressInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	_, cancel := lc.Subscribe() // progress is published only while someone subscribes
	defer cancel()
	go func() { _ = lc.Start(context.Background()) }()
	waitPhase(t, lc, "reclaim", lifecycle.PhaseRunning)
	before := lc.Snapshot().Seq
	close(release)
	waitState(t, lc, lifecycle.StateServing)
	// One publish per report, where the default interval would have
	// coalesced the burst into one or two.
	if n := lc.Snapshot().Seq - before; n < 50 {
		t.Fatalf("%d publishes for 50 reports", n)
	}
	mustDrain(t, lc)
}

func TestInvalidOptionsAndRetryPolicies(t *testing.T) {
	tests := []struct {
		name  string
		opt   lifecycle.Option
		retry lifecycle.RetryPolicy
		want  string
	}{
		{name: "negative stop timeout", opt: lifecycle.WithStopTimeout(-time.Second), want: "lifecycle: WithStopTimeout: negative duration -1s"},
		{name: "negative start timeout", opt: lifecycle.WithStartTimeout(-time.Second), want: "lifecycle: WithStartTimeout: negative duration -1s"},
		{name: "negative progress interval", opt: lifecycle.WithProgressInterval(-1), want: "lifecycle: WithProgressInterval: negative duration -1ns"},
		{name: "negative attempts", retry: lifecycle.RetryPolicy{Attempts: -1}, want: `phase "lock": negative retry attempts`},
		{name: "shrinking multiplier", retry: lifecycle.RetryPolicy{Multiplier: 0.5}, want: `phase "lock": retry multiplier below 1 or not finite`},
		{name: "jitter above 1", retry: lifecycle.RetryPolicy{Jitter: 1.5}, want: `phase "lock": retry jitter outside [0, 1]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var opts []lifecycle.Option
			if tc.opt != nil {
				opts = append(opts, tc.opt)
			}
			_, err := lifecycle.New([]lifecycle.Phase{{Name: "lock", Run: nop, Retry: tc.retry}}, opts...)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("New = %v, want %q", err, tc.want)
			}
			if _, ok := errors.AsType[*lifecycle.DeclarationError](err); !ok {
				t.Fatalf("untyped %T", err)
			}
		})
	}
}

// waitState waits, without a timed assertion, until the lifecycle has
// entered state.
func waitState(t *testing.T, lc *lifecycle.Lifecycle, state lifecycle.State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for e := range lc.WatchEvents(ctx, 0) {
		if e.Kind == lifecycle.EventLifecycle && e.To == state {
			return
		}
	}
	t.Fatalf("the lifecycle never entered %s", state)
}

// waitPhase waits, without a timed assertion, until the named phase is in
// state.
func waitPhase(t *testing.T, lc *lifecycle.Lifecycle, name string, state lifecycle.PhaseState) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for e := range lc.WatchEvents(ctx, 0) {
		if e.Kind == lifecycle.EventPhase && e.Name == name && e.To == state {
			return
		}
	}
	t.Fatalf("phase %s never reached %s", name, state)
}
