package lifecycle_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

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
}

// A serving lifecycle is not done: Wait returns only when its ctx ends, with
// ctx's cause.
func TestServingIsNotDone(t *testing.T) {
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
