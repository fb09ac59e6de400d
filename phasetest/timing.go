package phasetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// AssertOverlap checks that phases a and b ran in parallel: each started
// (its first attempt entered running) before the other ended (succeeded,
// failed or was cancelled). It judges by the events' sequence numbers, not
// by clocks, so it holds on any machine: two phases that ran one after the
// other, however quickly, fail it, and so does a phase that never started.
// A phase still running at the end of events has not ended. It is what
// [AssertOrder] cannot say: that independent phases did not wait for each
// other.
//
// events must be the log from its first event, as [Harness], [Recorder]
// and [Stream] give it with Events(0). AssertOverlap reports a violation
// with t.Errorf, with the log, and returns whether there was none.
func AssertOverlap(t testing.TB, events []lifecycle.Event, a, b string) bool {
	t.Helper()
	m := replay(events)
	var problems []string
	pa, pb := m.phases[a], m.phases[b]
	for _, name := range []string{a, b} {
		if p := m.phases[name]; p == nil || p.started == 0 {
			problems = append(problems, fmt.Sprintf("phase %s never started%s", name, stateOf(m, name)))
		}
	}
	if len(problems) == 0 {
		switch {
		case pa.ended != 0 && pa.ended < pb.started:
			problems = append(problems, fmt.Sprintf("phase %s ended (event %d) before %s started (event %d)", a, pa.ended, b, pb.started))
		case pb.ended != 0 && pb.ended < pa.started:
			problems = append(problems, fmt.Sprintf("phase %s ended (event %d) before %s started (event %d)", b, pb.ended, a, pa.started))
		}
	}
	return report(t, "phases "+a+" and "+b+" did not overlap", problems, events)
}

// AssertTookAtMost checks that phase ended at most d after it started,
// from the times on its events: from its first attempt entering running to
// its final event, retries and backoff included. A phase that never
// started or has not ended fails it.
//
// Timing assertions hold only with generous bounds: a test asserts a phase
// did not wait out a timeout or a delay of seconds, not that it took
// milliseconds. It reports a violation with t.Errorf, with the log, and
// returns whether there was none.
func AssertTookAtMost(t testing.TB, events []lifecycle.Event, phase string, d time.Duration) bool {
	t.Helper()
	took, problems := tookOf(events, phase)
	if problems == nil && took > d {
		problems = append(problems, fmt.Sprintf("phase %s took %v, more than %v", phase, took, d))
	}
	return report(t, "phase "+phase+" took too long", problems, events)
}

// AssertTookAtLeast checks that phase ended at least d after it started,
// measured as [AssertTookAtMost] does: that it waited for something (a
// backoff, a dependency's readiness) rather than giving up at once. It
// reports a violation with t.Errorf, with the log, and returns whether
// there was none.
func AssertTookAtLeast(t testing.TB, events []lifecycle.Event, phase string, d time.Duration) bool {
	t.Helper()
	took, problems := tookOf(events, phase)
	if problems == nil && took < d {
		problems = append(problems, fmt.Sprintf("phase %s took %v, less than %v", phase, took, d))
	}
	return report(t, "phase "+phase+" was too quick", problems, events)
}

// tookOf returns how long phase ran according to events, or the problems
// that leave it unknown.
func tookOf(events []lifecycle.Event, phase string) (time.Duration, []string) {
	m := replay(events)
	p := m.phases[phase]
	switch {
	case p == nil || p.started == 0:
		return 0, []string{fmt.Sprintf("phase %s never started%s", phase, stateOf(m, phase))}
	case p.ended == 0:
		return 0, []string{fmt.Sprintf("phase %s has not ended%s", phase, stateOf(m, phase))}
	}
	return p.endedAt.Sub(p.startedAt), nil
}

// replay builds the model of events, whatever their consistency
// ([AssertConsistent]'s business).
func replay(events []lifecycle.Event) *model {
	m := newModel()
	for _, e := range events {
		_ = m.apply(e)
	}
	return m
}
