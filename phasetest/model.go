package phasetest

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// The transitions the engine can take, read from the lifecycle's own table
// ([lifecycle.Transitions]) and never changed. A log in which any other
// appears was not written by a lifecycle, or lost an event.
var (
	lifecycleEdges = edgeSet(lifecycle.Transitions().Lifecycle)
	phaseEdges     = edgeSet(lifecycle.Transitions().Phase)
	taskEdges      = edgeSet(lifecycle.Transitions().Task)
)

// edgeSet is a machine's table as the set of its (from, to) pairs.
func edgeSet[S ~string](table []lifecycle.Edge[S]) map[[2]S]bool {
	out := make(map[[2]S]bool)
	for _, e := range table {
		for _, from := range e.From {
			out[[2]S{from, e.To}] = true
		}
	}
	return out
}

// reachable reports whether a lifecycle in state from can still enter to.
func reachable(from, to lifecycle.State) bool {
	seen := map[lifecycle.State]bool{from: true}
	queue := []lifecycle.State{from}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		for e := range lifecycleEdges {
			if e[0] == s && !seen[e[1]] {
				if e[1] == to {
					return true
				}
				seen[e[1]] = true
				queue = append(queue, e[1])
			}
		}
	}
	return false
}

// phaseModel is what the events say about one phase.
type phaseModel struct {
	state     lifecycle.PhaseState
	attempt   int
	err       string
	dependsOn []string
	started   uint64 // Seq of the first running event, 0 before
	succeeded uint64 // Seq of the succeeded event, 0 before
	ended     uint64 // Seq of the final event (succeeded, failed, cancelled, skipped), 0 before
	startedAt time.Time
	endedAt   time.Time
}

// model replays a log and checks, event by event, that it is one a
// lifecycle writes: numbered densely from 1, every transition one the
// engine can take and starting where the previous one of the same thing
// ended, nothing after the final event. A log that lost or repeated a
// transition fails one of these.
type model struct {
	next     uint64 // the Seq expected next
	state    lifecycle.State
	path     []lifecycle.State // every state entered, created first
	err      string            // the failure's text, once failed
	final    bool
	phases   map[string]*phaseModel
	order    []string // phases in the order they first appeared
	tasks    map[string]lifecycle.TaskState
	warnings map[string]string
}

func newModel() *model {
	return &model{
		next:     1,
		state:    lifecycle.StateCreated,
		path:     []lifecycle.State{lifecycle.StateCreated},
		phases:   map[string]*phaseModel{},
		tasks:    map[string]lifecycle.TaskState{},
		warnings: map[string]string{},
	}
}

// apply takes the next event and returns what is wrong with it, if
// anything. It applies the event either way, so that one problem does not
// hide the rest.
func (m *model) apply(e lifecycle.Event) error {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	m.applySeq(e, bad)
	switch e.Kind {
	case lifecycle.EventLifecycle:
		m.applyLifecycle(e, bad)
	case lifecycle.EventPhase:
		m.applyPhase(e, bad)
	case lifecycle.EventTask:
		m.applyTask(e, bad)
	case lifecycle.EventWarningSet, lifecycle.EventWarningCleared:
		m.applyWarning(e, bad)
	default:
		bad("unknown kind %q", e.Kind)
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%v: %s", e, strings.Join(problems, "; "))
}

// complaint records one thing wrong with the event being applied.
type complaint func(format string, args ...any)

// applySeq checks that e is numbered next and comes before the final event.
func (m *model) applySeq(e lifecycle.Event, bad complaint) {
	switch {
	case e.Seq == m.next+1:
		bad("event %d is missing", m.next)
	case e.Seq > m.next:
		bad("events %d to %d are missing", m.next, e.Seq-1)
	case e.Seq < m.next:
		bad("event %d is repeated or out of order (want %d)", e.Seq, m.next)
	}
	m.next = e.Seq + 1
	if m.final {
		bad("recorded after the final event")
	}
}

// applyLifecycle checks a transition of the lifecycle against its machine
// and the state it was last seen in.
func (m *model) applyLifecycle(e lifecycle.Event, bad complaint) {
	from, _ := e.From.(lifecycle.State)
	to, _ := e.To.(lifecycle.State)
	if from != m.state {
		bad("the lifecycle leaves %s but was %s", from, m.state)
	}
	if !lifecycleEdges[[2]lifecycle.State{from, to}] {
		bad("%s→%s is not a lifecycle transition", from, to)
	}
	m.state = to
	m.path = append(m.path, to)
	if to == lifecycle.StateFailed {
		m.err = e.Err
	}
	m.final = e.Final()
}

// applyPhase checks a transition of a phase against its machine, the
// state it was last seen in, the lifecycle's state and its dependencies
// as first declared, and records when it started and ended.
func (m *model) applyPhase(e lifecycle.Event, bad complaint) {
	p := m.phases[e.Name]
	if p == nil {
		p = &phaseModel{state: lifecycle.PhasePending, dependsOn: e.DependsOn}
		m.phases[e.Name] = p
		m.order = append(m.order, e.Name)
	}
	from, _ := e.From.(lifecycle.PhaseState)
	to, _ := e.To.(lifecycle.PhaseState)
	if from != p.state {
		bad("phase %s leaves %s but was %s", e.Name, from, p.state)
	}
	if !phaseEdges[[2]lifecycle.PhaseState{from, to}] {
		bad("%s→%s is not a phase transition", from, to)
	}
	if m.state != lifecycle.StateStarting && m.state != lifecycle.StateDraining {
		bad("a phase moves while the lifecycle is %s", m.state)
	}
	if !slices.Equal(e.DependsOn, p.dependsOn) {
		bad("phase %s depends on %v here and on %v before", e.Name, e.DependsOn, p.dependsOn)
	}
	p.state, p.attempt, p.err = to, e.Attempt, e.Err
	switch {
	case to == lifecycle.PhaseRunning && p.started == 0:
		p.started, p.startedAt = e.Seq, e.Time
	case to == lifecycle.PhaseSucceeded:
		p.succeeded = e.Seq
	}
	if to.Done() {
		p.ended, p.endedAt = e.Seq, e.Time
	}
}

// applyTask checks a transition of a background task against its machine
// and the state it was last seen in.
func (m *model) applyTask(e lifecycle.Event, bad complaint) {
	from, _ := e.From.(lifecycle.TaskState)
	to, _ := e.To.(lifecycle.TaskState)
	if cur := m.tasks[e.Name]; from != cur {
		bad("task %s leaves %q but was %q", e.Name, from, cur)
	}
	if !taskEdges[[2]lifecycle.TaskState{from, to}] {
		bad("%q→%q is not a task transition", from, to)
	}
	m.tasks[e.Name] = to
}

// applyWarning checks that a warning set changes its message and that a
// warning cleared was set.
func (m *model) applyWarning(e lifecycle.Event, bad complaint) {
	if e.Kind == lifecycle.EventWarningSet {
		if old, set := m.warnings[e.Name]; set && old == e.Message {
			bad("warning %s set again to the same message", e.Name)
		}
		m.warnings[e.Name] = e.Message
		return
	}
	if _, set := m.warnings[e.Name]; !set {
		bad("warning %s cleared but not set", e.Name)
	}
	delete(m.warnings, e.Name)
}

// summary says where the lifecycle and each phase got to, for a failure
// message: what was seen instead of what a test waited for.
func (m *model) summary() string {
	var b strings.Builder
	b.WriteString("lifecycle ")
	for i, s := range m.path {
		if i > 0 {
			b.WriteString("→")
		}
		b.WriteString(string(s))
	}
	if m.err != "" {
		fmt.Fprintf(&b, " (%s)", m.err)
	}
	if len(m.order) == 0 {
		b.WriteString("; no phase has moved")
	}
	for i, name := range m.order {
		p := m.phases[name]
		if i == 0 {
			b.WriteString("; phases: ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s", name, p.state)
		if p.attempt > 1 {
			fmt.Fprintf(&b, " (attempt %d)", p.attempt)
		}
		if p.err != "" && p.state != lifecycle.PhaseSucceeded {
			fmt.Fprintf(&b, " [%s]", p.err)
		}
	}
	return b.String()
}
