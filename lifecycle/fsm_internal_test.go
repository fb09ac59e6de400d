package lifecycle

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/looplab/fsm"
)

// TestOnlyDeclaredTransitionsHappen fires every event from every state of
// both machines and checks that exactly the transitions of the package
// documentation are accepted.
func TestOnlyDeclaredTransitionsHappen(t *testing.T) {
	tests := []struct {
		name    string
		states  []string
		events  []string
		newFSM  func(initial string) *fsm.FSM
		allowed []edge
	}{
		{
			name:   "lifecycle",
			states: []string{"created", "starting", "serving", "draining", "stopped", "failed"},
			events: []string{evStart, evServe, evDrain, evStop, evFail, evRetry, evRun, evOK, evCancel, evSkip},
			newFSM: func(s string) *fsm.FSM { return fsm.NewFSM(s, lifecycleEvents, nil) },
			allowed: []edge{
				{"created", evStart, "starting"},
				{"starting", evServe, "serving"},
				{"starting", evFail, "failed"},
				{"starting", evDrain, "draining"},
				{"serving", evDrain, "draining"},
				{"serving", evFail, "failed"},
				{"draining", evStop, "stopped"},
				{"failed", evStop, "stopped"},
			},
		},
		{
			name:   "phase",
			states: []string{"pending", "running", "retrying", "succeeded", "failed", "cancelled", "skipped"},
			events: []string{evStart, evServe, evDrain, evStop, evFail, evRetry, evRun, evOK, evCancel, evSkip},
			newFSM: func(s string) *fsm.FSM { return fsm.NewFSM(s, phaseEvents, nil) },
			allowed: []edge{
				{"pending", evRun, "running"},
				{"pending", evSkip, "skipped"},
				{"running", evOK, "succeeded"},
				{"running", evFail, "failed"},
				{"running", evCancel, "cancelled"},
				{"running", evRetry, "retrying"},
				{"retrying", evRun, "running"},
				{"retrying", evFail, "failed"},
				{"retrying", evCancel, "cancelled"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			accepted := 0
			for _, from := range tc.states {
				for _, ev := range tc.events {
					if fireOnce(t, tc.newFSM(from), tc.allowed, ev) {
						accepted++
					}
				}
			}
			if accepted != len(tc.allowed) {
				t.Errorf("%d transitions accepted, want %d", accepted, len(tc.allowed))
			}
		})
	}
}

// edge is a transition a machine declares: from a state, on an event, to
// a state.
type edge struct{ from, event, to string }

// fireOnce fires ev on f and checks the outcome against allowed: the
// declared transition taken, or an undeclared one refused and f left where
// it was. It reports whether ev was accepted as declared.
func fireOnce(t *testing.T, f *fsm.FSM, allowed []edge, ev string) bool {
	t.Helper()
	from := f.Current()
	err := f.Event(context.Background(), ev)
	var want *edge
	for i := range allowed {
		if allowed[i].from == from && allowed[i].event == ev {
			want = &allowed[i]
		}
	}
	switch {
	case want == nil && err == nil:
		t.Errorf("%s --%s--> %s was accepted", from, ev, f.Current())
	case want == nil:
		var inv fsm.InvalidEventError
		var unk fsm.UnknownEventError
		if !errors.As(err, &inv) && !errors.As(err, &unk) {
			t.Errorf("%s --%s--> refused with unexpected %T %v", from, ev, err, err)
		}
		if f.Current() != from {
			t.Errorf("refused event moved %s to %s", from, f.Current())
		}
	case err != nil:
		t.Errorf("%s --%s--> refused: %v", from, ev, err)
	case f.Current() != want.to:
		t.Errorf("%s --%s--> %s, want %s", from, ev, f.Current(), want.to)
	default:
		return true
	}
	return false
}

func TestRetryDelay(t *testing.T) {
	tests := []struct {
		name   string
		policy RetryPolicy
		want   []time.Duration // after attempts 1, 2, 3, ...
	}{
		{"zero backoff retries at once", RetryPolicy{}, []time.Duration{0, 0, 0}},
		{"zero multiplier doubles", RetryPolicy{Backoff: 100 * time.Millisecond}, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}},
		{"multiplier one is constant", RetryPolicy{Backoff: 5 * time.Millisecond, Multiplier: 1}, []time.Duration{5 * time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond}},
		{"no cap never overflows", RetryPolicy{Backoff: time.Hour, Multiplier: 1e6}, []time.Duration{time.Hour, time.Duration(1e6) * time.Hour, math.MaxInt64, math.MaxInt64}},
		{"multiplier", RetryPolicy{Backoff: 10 * time.Millisecond, Multiplier: 3}, []time.Duration{10 * time.Millisecond, 30 * time.Millisecond, 90 * time.Millisecond}},
		{"capped", RetryPolicy{Backoff: time.Second, MaxBackoff: 3 * time.Second}, []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for i, want := range tc.want {
				if got := tc.policy.delay(i + 1); got != want {
					t.Errorf("delay after attempt %d = %v, want %v", i+1, got, want)
				}
			}
		})
	}
	t.Run("jitter stays in bounds and varies", func(t *testing.T) {
		p := RetryPolicy{Backoff: 100 * time.Millisecond, Jitter: 0.5}
		seen := map[time.Duration]bool{}
		for range 200 {
			d := p.delay(1)
			if d < 50*time.Millisecond || d > 150*time.Millisecond {
				t.Fatalf("jittered delay %v outside [50ms, 150ms]", d)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Fatalf("jitter produced only %d distinct delays", len(seen))
		}
	})
}

// Transitions hands out a copy: changing it changes nothing the engine runs.
func TestTransitionsIsACopy(t *testing.T) {
	m := Transitions()
	m.Lifecycle[0].From[0] = "elsewhere"
	m.Phase[0].To = "elsewhere"
	m.Task = m.Task[:0]
	if transitions.Lifecycle[0].From[0] != StateCreated || transitions.Phase[0].To != PhaseRunning || len(transitions.Task) == 0 {
		t.Errorf("changing the copy changed the table: %+v", transitions)
	}
}
