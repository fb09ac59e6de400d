package status

import (
	"strings"
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

// The table's DURATION says, for a phase not yet over, the most it can
// take before it fails for good; once over, how long it took.
func TestWriteTableShowsTheWorstCase(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	v := NewView(lifecycle.Snapshot{State: lifecycle.StateStarting, Since: t0, Phases: []lifecycle.PhaseSnapshot{
		{Name: "config", State: lifecycle.PhaseSucceeded, Attempts: 1, Started: t0, Ended: t0.Add(2 * time.Millisecond), WorstCase: time.Second},
		{Name: "registry", State: lifecycle.PhaseRetrying, Attempts: 3, Started: t0, WorstCase: 2325 * time.Millisecond},
		{Name: "serve", State: lifecycle.PhasePending, WorstCase: time.Second},
		{Name: "warm", State: lifecycle.PhasePending},
	}}, nil)
	var b strings.Builder
	WriteTable(&b, v)
	for _, want := range []string{
		"config    succeeded  2ms  ",
		"registry  retrying   ", ", at most 2.325s",
		"serve     pending    -, at most 1s",
		"warm      pending    -  ",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "2ms, at most") {
		t.Errorf("a phase that is over still shows its worst case:\n%s", b.String())
	}
}
