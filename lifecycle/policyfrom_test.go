package lifecycle_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// A phase's timeout and retries can come from the configuration an
// earlier phase read: the registry phase, after config, times out and
// retries as config said, and its worst case is unknown until then.
func TestPolicyFromAnEarlierPhase(t *testing.T) {
	var read lifecycle.AttemptBounds // filled by config
	var attempts atomic.Int32
	registry := lifecycle.Phase{Name: "registry", DependsOn: []string{"config"},
		PolicyFrom: func() (lifecycle.AttemptBounds, error) { return read, nil },
		Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			attempts.Add(1)
			<-ctx.Done()
			return ctx.Err()
		}}
	if _, bounded := registry.WorstCase(); bounded {
		t.Error("WorstCase of a phase whose policy comes at run time says it is bounded")
	}
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "config", Run: func(context.Context, *lifecycle.Progress) error {
			read = lifecycle.AttemptBounds{Timeout: 10 * time.Millisecond, Retry: lifecycle.RetryPolicy{Attempts: 3, Backoff: time.Millisecond}}
			return nil
		}},
		registry,
	})
	if err != nil {
		t.Fatal(err)
	}
	worstCase := func() time.Duration {
		p, _ := lc.Snapshot().Phase("registry")
		return p.WorstCase
	}
	if d := worstCase(); d != 0 {
		t.Errorf("registry's worst case before its policy was given: %v, want none", d)
	}
	err = lc.Start(context.Background())
	var pe *lifecycle.PhaseError
	var te *lifecycle.AttemptTimeoutError
	if !errors.As(err, &pe) || pe.Attempts != 3 || !errors.As(err, &te) || te.Timeout != 10*time.Millisecond {
		t.Fatalf("Start: %v, want registry failed after the 3 attempts of 10ms config gave", err)
	}
	if attempts.Load() != 3 {
		t.Errorf("Run called %d times, want 3", attempts.Load())
	}
	want, _ := lifecycle.Phase{Timeout: read.Timeout, Retry: read.Retry}.WorstCase()
	if d := worstCase(); d != want || d < 30*time.Millisecond {
		t.Errorf("registry's worst case once its policy was given: %v, want %v", d, want)
	}
}

// A policy New would refuse, an error of PolicyFrom and a panic in it each
// fail the phase at once with a PolicyError, before Run; and New refuses
// a phase that sets Timeout or Retry beside PolicyFrom.
func TestPolicyFromRefused(t *testing.T) {
	errUnreadable := errors.New("timeouts.toml unreadable")
	for _, tc := range []struct {
		name string
		from func() (lifecycle.AttemptBounds, error)
		want string
	}{
		{"negative timeout", func() (lifecycle.AttemptBounds, error) { return lifecycle.AttemptBounds{Timeout: -time.Second}, nil }, "negative Timeout"},
		{"jitter out of range", func() (lifecycle.AttemptBounds, error) {
			return lifecycle.AttemptBounds{Retry: lifecycle.RetryPolicy{Attempts: 5, Jitter: 2}}, nil
		}, "jitter outside [0, 1]"},
		{"PolicyFrom fails", func() (lifecycle.AttemptBounds, error) { return lifecycle.AttemptBounds{}, errUnreadable }, errUnreadable.Error()},
		{"PolicyFrom panics", func() (lifecycle.AttemptBounds, error) { panic("no config") }, "panic: no config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ran := false
			lc, err := lifecycle.New([]lifecycle.Phase{{Name: "registry", PolicyFrom: tc.from,
				Run: func(context.Context, *lifecycle.Progress) error { ran = true; return nil }}})
			if err != nil {
				t.Fatal(err)
			}
			err = lc.Start(context.Background())
			var pe *lifecycle.PolicyError
			if !errors.As(err, &pe) || pe.Phase != "registry" || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Start: %v, want a PolicyError saying %q", err, tc.want)
			}
			if ran {
				t.Error("Run was called with a refused policy")
			}
		})
	}
	_, err := lifecycle.New([]lifecycle.Phase{{Name: "registry", Timeout: time.Second,
		PolicyFrom: func() (lifecycle.AttemptBounds, error) { return lifecycle.AttemptBounds{}, nil },
		Run:        func(context.Context, *lifecycle.Progress) error { return nil }}})
	var de *lifecycle.DeclarationError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "PolicyFrom") {
		t.Errorf("New with Timeout beside PolicyFrom: %v, want a DeclarationError naming PolicyFrom", err)
	}
}
