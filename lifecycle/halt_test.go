package lifecycle_test

import (
	"context"
	"errors"
	"testing"

	"github.com/phasegate/phasegate/lifecycle"
)

// TestNoPhaseBeginsAfterTheStartHalted checks the rule the package doc
// states: once a phase failed, the start timed out or a drain began, no
// phase begins, not even one whose goroutine was already launched (an
// independent phase declared beside the one that fails). Whether such a
// phase began before the halt is up to the scheduler, so the test runs the
// race many times and asserts on the event log, which orders both.
func TestNoPhaseBeginsAfterTheStartHalted(t *testing.T) {
	tests := []struct {
		name string
		// first is the phase that halts the start, given a way to drain.
		first  func(drain func()) func(context.Context, *lifecycle.Progress) error
		drains bool // first drains the lifecycle
		// halt says whether e is the event that halts the start.
		halt func(e lifecycle.Event) bool
	}{
		{
			name: "a phase failed",
			first: func(func()) func(context.Context, *lifecycle.Progress) error {
				return func(context.Context, *lifecycle.Progress) error {
					return lifecycle.Permanent(errors.New("bad flag"))
				}
			},
			halt: func(e lifecycle.Event) bool {
				return e.Kind == lifecycle.EventPhase && e.To == lifecycle.PhaseFailed
			},
		},
		{
			name:   "a drain began",
			drains: true,
			first: func(drain func()) func(context.Context, *lifecycle.Progress) error {
				return func(ctx context.Context, _ *lifecycle.Progress) error {
					drain()
					<-ctx.Done()
					return ctx.Err()
				}
			},
			halt: func(e lifecycle.Event) bool {
				return e.Kind == lifecycle.EventLifecycle && e.To == lifecycle.StateDraining
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range 200 {
				var lc *lifecycle.Lifecycle
				drained := make(chan error, 1)
				drain := func() { go func() { drained <- lc.Drain(context.Background()) }() }
				phases := []lifecycle.Phase{
					{Name: "config", Run: tt.first(drain)},
					{Name: "listen", Run: nop},
					{Name: "warm", Run: nop},
					{Name: "serve", DependsOn: []string{"config", "listen", "warm"}, Run: nop},
				}
				var err error
				if lc, err = lifecycle.New(phases); err != nil {
					t.Fatal(err)
				}
				if err := lc.Start(context.Background()); err == nil {
					t.Fatal("Start succeeded, want it halted")
				}
				if tt.drains {
					if err := <-drained; err != nil {
						t.Fatalf("Drain: %v", err)
					}
				}
				halted := false
				for _, e := range lc.Events(0) {
					if tt.halt(e) {
						halted = true
					}
					if halted && e.Kind == lifecycle.EventPhase && e.From == lifecycle.PhasePending && e.To == lifecycle.PhaseRunning {
						t.Fatalf("run %d: phase %s began after the start halted (event %d)", i, e.Name, e.Seq)
					}
				}
				if !halted {
					t.Fatalf("run %d: no halting event in the log", i)
				}
				for _, p := range lc.Snapshot().Phases {
					if p.State == lifecycle.PhasePending || p.State == lifecycle.PhaseRunning {
						t.Fatalf("run %d: phase %s ended %s", i, p.Name, p.State)
					}
				}
			}
		})
	}
}
