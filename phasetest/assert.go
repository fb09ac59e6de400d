package phasetest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/lifecycle"
)

// maxReported bounds the problems one assertion reports; the first few say
// what went wrong, the rest would bury them.
const maxReported = 10

// AssertConsistent checks that events is a whole, intact lifecycle log: numbered
// 1, 2, 3, … with no gap or repeat; every lifecycle, phase and task
// transition one the engine can take, leaving the state the previous event
// of the same thing entered; phases moving only while the lifecycle starts
// or drains; a phase's DependsOn the same on all its events; nothing after
// the final event. A log that lost or duplicated a transition fails it. It
// reports each problem with t.Errorf and returns whether there was none.
func AssertConsistent(t testing.TB, events []lifecycle.Event) bool {
	t.Helper()
	m := newModel()
	var problems []string
	for _, e := range events {
		if err := m.apply(e); err != nil {
			problems = append(problems, err.Error())
		}
	}
	return report(t, "the event log is not consistent", problems, events)
}

// AssertOrder checks that the named phases ran one after the other: each
// started (its first attempt entered running) only after the one named
// before it had succeeded. Every named phase must therefore have started,
// and every one but the last have succeeded. It says nothing about phases
// not named, nor that a phase started right after the previous succeeded:
// two phases that only share a dependency may run in either order, or
// together, and then fail it.
//
// events must be the log from its first event, as [Harness], [Recorder] and
// [Stream] give it with Events(0). AssertOrder reports each violation with
// t.Errorf, with the log, and returns whether there was none.
func AssertOrder(t testing.TB, events []lifecycle.Event, phases ...string) bool {
	t.Helper()
	m := newModel()
	for _, e := range events {
		_ = m.apply(e) // AssertConsistent's business; the order is checked on what is there
	}
	var problems []string
	for i, name := range phases {
		p := m.phases[name]
		switch {
		case p == nil || p.started == 0:
			problems = append(problems, fmt.Sprintf("phase %s never started%s", name, stateOf(m, name)))
			continue
		case i == 0:
			continue
		}
		prev := phases[i-1]
		q := m.phases[prev]
		switch {
		case q == nil || q.succeeded == 0:
			problems = append(problems, fmt.Sprintf("phase %s started (event %d) but %s never succeeded%s",
				name, p.started, prev, stateOf(m, prev)))
		case p.started < q.succeeded:
			problems = append(problems, fmt.Sprintf("phase %s started (event %d) before %s succeeded (event %d)",
				name, p.started, prev, q.succeeded))
		}
	}
	return report(t, "phases out of order "+strings.Join(phases, " → "), problems, events)
}

// AssertRespectsDependencies checks, from the events alone, that every
// phase started each of its attempts only after every phase in its DependsOn
// had succeeded: the guarantee the engine gives. events must be the log from
// its first event. It reports each violation with t.Errorf, with the log,
// and returns whether there was none.
func AssertRespectsDependencies(t testing.TB, events []lifecycle.Event) bool {
	t.Helper()
	succeeded := map[string]uint64{}
	var problems []string
	for _, e := range events {
		if e.Kind != lifecycle.EventPhase {
			continue
		}
		switch e.To {
		case lifecycle.PhaseSucceeded:
			succeeded[e.Name] = e.Seq
		case lifecycle.PhaseRunning:
			for _, d := range e.DependsOn {
				if succeeded[d] == 0 {
					problems = append(problems, fmt.Sprintf("phase %s started attempt %d (event %d) before its dependency %s succeeded",
						e.Name, e.Attempt, e.Seq, d))
				}
			}
		}
	}
	return report(t, "dependencies not respected", problems, events)
}

func stateOf(m *model, name string) string {
	if p := m.phases[name]; p != nil {
		s := fmt.Sprintf(": it is %s", p.state)
		if p.err != "" {
			s += " [" + p.err + "]"
		}
		return s
	}
	return ": it has no event"
}

// report fails t with the problems, if any, followed by the log they are
// about.
func report(t testing.TB, what string, problems []string, events []lifecycle.Event) bool {
	t.Helper()
	if len(problems) == 0 {
		return true
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s:\n", what)
	for i, p := range problems {
		if i == maxReported {
			fmt.Fprintf(&b, "  … and %d more\n", len(problems)-i)
			break
		}
		fmt.Fprintf(&b, "  %s\n", p)
	}
	b.WriteString(formatLog(events))
	t.Errorf("%s", b.String())
	return false
}

// formatLog renders events one per line, for failure messages.
func formatLog(events []lifecycle.Event) string {
	if len(events) == 0 {
		return "events: none"
	}
	var b strings.Builder
	b.WriteString("events:")
	for _, e := range events {
		b.WriteString("\n    ")
		b.WriteString(e.String())
	}
	return b.String()
}
