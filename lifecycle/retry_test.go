package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

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

// An attempt that times out keeps the error its Run returned, which names
// what it waited for: the message ends with it, and errors.Is sees both
// the deadline and the phase's own sentinel.
func TestAttemptTimeoutKeepsThePhasesError(t *testing.T) {
	errRegistry := errors.New("registry 127.0.0.1:5000 unreachable")
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name:    "registry",
		Timeout: 20 * time.Millisecond,
		Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			<-ctx.Done()
			return fmt.Errorf("%w: GET /v2/: %w", errRegistry, ctx.Err())
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	err = lc.Start(context.Background())
	var te *lifecycle.AttemptTimeoutError
	switch {
	case !errors.As(err, &te) || !errors.Is(te.Err, errRegistry):
		t.Fatalf("err = %v, want an AttemptTimeoutError holding the phase's own error", err)
	case !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errRegistry):
		t.Fatalf("err = %v: want it to wrap both context.DeadlineExceeded and the phase's error", err)
	case err.Error() != `phase "registry" failed after 1 attempt: attempt 1 timed out after 20ms: registry 127.0.0.1:5000 unreachable: GET /v2/: context deadline exceeded`:
		t.Fatalf("message = %q", err)
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

// A phase's worst case is every attempt timing out and every wait at the
// top of its jitter; without a timeout nothing bounds it.
func TestWorstCase(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p       lifecycle.Phase
		want    time.Duration
		bounded bool
	}{
		{"no timeout", lifecycle.Phase{Retry: lifecycle.RetryPolicy{Attempts: 5}}, 0, false},
		{"one attempt", lifecycle.Phase{Timeout: time.Second}, time.Second, true},
		{"the adopter's registry", lifecycle.Phase{Timeout: 300 * time.Millisecond, Retry: lifecycle.RetryPolicy{
			Attempts: 5, Backoff: 50 * time.Millisecond, Jitter: 0.1}}, 2325 * time.Millisecond, true},
		{"capped", lifecycle.Phase{Timeout: time.Second, Retry: lifecycle.RetryPolicy{
			Attempts: 4, Backoff: time.Second, MaxBackoff: 2 * time.Second, Multiplier: 3}}, 9 * time.Second, true},
		{"saturates", lifecycle.Phase{Timeout: time.Hour, Retry: lifecycle.RetryPolicy{
			Attempts: 100, Backoff: time.Hour, Multiplier: 10}}, time.Duration(1<<63 - 1), true},
	} {
		got, bounded := tc.p.WorstCase()
		if bounded != tc.bounded || (got-tc.want).Abs() > time.Microsecond {
			t.Errorf("%s: WorstCase %v %v, want %v %v", tc.name, got, bounded, tc.want, tc.bounded)
		}
		// The views read it from the snapshot, zero when unbounded.
		tc.p.Name, tc.p.Run = "registry", func(context.Context, *lifecycle.Progress) error { return nil }
		lc, err := lifecycle.New([]lifecycle.Phase{tc.p})
		if err != nil {
			t.Fatal(err)
		}
		if p, _ := lc.Snapshot().Phase("registry"); (p.WorstCase - tc.want).Abs() > time.Microsecond {
			t.Errorf("%s: the snapshot's WorstCase %v, want %v", tc.name, p.WorstCase, tc.want)
		}
	}
}
