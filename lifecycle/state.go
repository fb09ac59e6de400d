package lifecycle

import (
	"fmt"
	"slices"

	"github.com/looplab/fsm"
)

// State is the state of a whole lifecycle.
type State string

// Lifecycle states. See [Machines] for the transitions.
const (
	StateCreated  State = "created"
	StateStarting State = "starting"
	StateServing  State = "serving"
	StateDraining State = "draining"
	StateStopped  State = "stopped"
	StateFailed   State = "failed"
)

// EventState is the state an [Event] moves from or to: a [State] in the
// lifecycle's events, a [PhaseState] in a phase's, a [TaskState] in a
// task's. It compares with the constants of its kind as they are, without
// a conversion (e.To == PhaseSucceeded), and never equals another kind's
// state of the same name: a phase's failed is not the lifecycle's.
type EventState interface {
	fmt.Stringer
	eventState()
}

func (s State) String() string { return string(s) }
func (State) eventState()      {}

// PhaseState is the state of one phase.
type PhaseState string

// Phase states. See [Machines] for the transitions.
const (
	PhasePending   PhaseState = "pending"
	PhaseRunning   PhaseState = "running"
	PhaseRetrying  PhaseState = "retrying"
	PhaseSucceeded PhaseState = "succeeded"
	PhaseFailed    PhaseState = "failed"
	PhaseCancelled PhaseState = "cancelled"
	PhaseSkipped   PhaseState = "skipped"
)

// Done reports whether s is final: the phase will not run again.
func (s PhaseState) Done() bool {
	switch s {
	case PhaseSucceeded, PhaseFailed, PhaseCancelled, PhaseSkipped:
		return true
	}
	return false
}

func (s PhaseState) String() string { return string(s) }
func (PhaseState) eventState()      {}

// TaskState is the state of a background task handed off by a phase with
// [Progress.Defer].
type TaskState string

// Background task states. See [Machines] for the transitions.
const (
	TaskRunning   TaskState = "running"
	TaskSucceeded TaskState = "succeeded"
	TaskFailed    TaskState = "failed"
	TaskCancelled TaskState = "cancelled"
)

func (s TaskState) String() string { return string(s) }
func (TaskState) eventState()      {}

// EventStateOf is the state named s in an event of kind: a [State],
// [PhaseState] or [TaskState], or nil for "" and for a kind without
// states. It is what a decoded event's From and To hold.
func EventStateOf(kind EventKind, s string) EventState {
	if s == "" {
		return nil
	}
	switch kind {
	case EventLifecycle:
		return State(s)
	case EventPhase:
		return PhaseState(s)
	case EventTask:
		return TaskState(s)
	}
	return nil
}

// Event names of the lifecycle state machine.
const (
	evStart  = "start"
	evServe  = "serve"
	evDrain  = "drain"
	evStop   = "stop"
	evFail   = "fail"
	evRetry  = "retry"
	evRun    = "run"
	evOK     = "succeed"
	evCancel = "cancel"
	evSkip   = "skip"
)

// Edge is one transition of a state machine of the package: Event, fired
// in any of the states From, moves the machine to To.
type Edge[S ~string] struct {
	Event string
	From  []S
	To    S
}

// Machines are the package's state machines as tables of their edges, and
// no other transition can happen. They are declared once, below: the
// looplab/fsm machines of the lifecycle and of each phase are built from
// them, the event log records their transitions, and the phasetest
// package's model of a log reads them through [Transitions].
type Machines struct {
	// Lifecycle is the whole lifecycle's machine, from [StateCreated].
	Lifecycle []Edge[State]
	// Phase is each phase's machine, from [PhasePending].
	Phase []Edge[PhaseState]
	// Task is each background task's, from "" (not started yet). Tasks
	// take no fsm: task.go moves them along these edges only.
	Task []Edge[TaskState]
}

// transitions is the one declaration of the state machines. A drain that
// arrives while starting moves the lifecycle to draining at once and
// cancels the start: an orderly stop, not a failure.
var transitions = Machines{
	Lifecycle: []Edge[State]{
		{Event: evStart, From: []State{StateCreated}, To: StateStarting},
		{Event: evServe, From: []State{StateStarting}, To: StateServing},
		{Event: evDrain, From: []State{StateStarting, StateServing}, To: StateDraining},
		{Event: evFail, From: []State{StateStarting, StateServing}, To: StateFailed},
		{Event: evStop, From: []State{StateDraining, StateFailed}, To: StateStopped},
	},
	Phase: []Edge[PhaseState]{
		{Event: evRun, From: []PhaseState{PhasePending, PhaseRetrying}, To: PhaseRunning},
		{Event: evRetry, From: []PhaseState{PhaseRunning}, To: PhaseRetrying},
		{Event: evOK, From: []PhaseState{PhaseRunning}, To: PhaseSucceeded},
		{Event: evFail, From: []PhaseState{PhaseRunning, PhaseRetrying}, To: PhaseFailed},
		{Event: evCancel, From: []PhaseState{PhaseRunning, PhaseRetrying}, To: PhaseCancelled},
		{Event: evSkip, From: []PhaseState{PhasePending}, To: PhaseSkipped},
	},
	Task: []Edge[TaskState]{
		{Event: evStart, From: []TaskState{""}, To: TaskRunning},
		{Event: evOK, From: []TaskState{TaskRunning}, To: TaskSucceeded},
		{Event: evFail, From: []TaskState{TaskRunning}, To: TaskFailed},
		{Event: evCancel, From: []TaskState{TaskRunning}, To: TaskCancelled},
	},
}

// Transitions returns a copy of the package's state machines, the table
// the engine runs: a model of the event log checks each transition against
// it rather than against a copy of its own.
func Transitions() Machines {
	return Machines{
		Lifecycle: cloneEdges(transitions.Lifecycle),
		Phase:     cloneEdges(transitions.Phase),
		Task:      cloneEdges(transitions.Task),
	}
}

func cloneEdges[S ~string](edges []Edge[S]) []Edge[S] {
	out := make([]Edge[S], len(edges))
	for i, e := range edges {
		out[i] = Edge[S]{Event: e.Event, From: slices.Clone(e.From), To: e.To}
	}
	return out
}

// fsmEvents is a machine's table as looplab/fsm takes it.
func fsmEvents[S ~string](edges []Edge[S]) fsm.Events {
	out := make(fsm.Events, len(edges))
	for i, e := range edges {
		src := make([]string, len(e.From))
		for j, s := range e.From {
			src[j] = string(s)
		}
		out[i] = fsm.EventDesc{Name: e.Event, Src: src, Dst: string(e.To)}
	}
	return out
}

// The fsm tables, derived once from transitions and never changed: every
// machine New builds shares them.
var (
	lifecycleEvents = fsmEvents(transitions.Lifecycle)
	phaseEvents     = fsmEvents(transitions.Phase)
)
