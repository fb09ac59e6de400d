package status

import (
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// The /debug/lifecycle view carries the rate and time left of a running
// phase.
func TestViewWithETA(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	v := NewView(lifecycle.Snapshot{State: lifecycle.StateStarting, Phases: []lifecycle.PhaseSnapshot{{
		Name: "reclaim", State: lifecycle.PhaseRunning, Attempts: 1, Started: t0,
		Progress: lifecycle.ProgressSnapshot{Done: 500, Total: 1000, Unit: "namespaces"},
		ETA:      lifecycle.Estimate{Rate: 500, Remaining: time.Second, OK: true},
	}}}, nil)
	if p := v.Phases[0]; p.Rate != 500 || p.ETA != time.Second {
		t.Errorf("rate %v eta %v, want 500/s and 1s", p.Rate, p.ETA)
	}
}
