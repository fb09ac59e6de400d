package lifecycle

import "github.com/looplab/fsm"

// State is the state of a whole lifecycle.
type State string

// Lifecycle states. See the package documentation for the transitions.
const (
	StateCreated  State = "created"
	StateStarting State = "starting"
	StateServing  State = "serving"
	StateDraining State = "draining"
	StateStopped  State = "stopped"
	StateFailed   State = "failed"
)

// PhaseState is the state of one phase.
type PhaseState string

// Phase states. See the package documentation for the transitions.
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

// TaskState is the state of a background task handed off by a phase with
// [Progress.Defer].
type TaskState string

// Background task states.
const (
	TaskRunning   TaskState = "running"
	TaskSucceeded TaskState = "succeeded"
	TaskFailed    TaskState = "failed"
	TaskCancelled TaskState = "cancelled"
)

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

// lifecycleEvents is the only set of transitions a lifecycle can take. A
// drain that arrives while starting moves the lifecycle to draining at once
// and cancels the start: an orderly stop, not a failure.
var lifecycleEvents = fsm.Events{
	{Name: evStart, Src: []string{string(StateCreated)}, Dst: string(StateStarting)},
	{Name: evServe, Src: []string{string(StateStarting)}, Dst: string(StateServing)},
	{Name: evDrain, Src: []string{string(StateStarting), string(StateServing)}, Dst: string(StateDraining)},
	{Name: evFail, Src: []string{string(StateStarting), string(StateServing)}, Dst: string(StateFailed)},
	{Name: evStop, Src: []string{string(StateDraining), string(StateFailed)}, Dst: string(StateStopped)},
}

// phaseEvents is the only set of transitions a phase can take.
var phaseEvents = fsm.Events{
	{Name: evRun, Src: []string{string(PhasePending), string(PhaseRetrying)}, Dst: string(PhaseRunning)},
	{Name: evRetry, Src: []string{string(PhaseRunning)}, Dst: string(PhaseRetrying)},
	{Name: evOK, Src: []string{string(PhaseRunning)}, Dst: string(PhaseSucceeded)},
	{Name: evFail, Src: []string{string(PhaseRunning), string(PhaseRetrying)}, Dst: string(PhaseFailed)},
	{Name: evCancel, Src: []string{string(PhaseRunning), string(PhaseRetrying)}, Dst: string(PhaseCancelled)},
	{Name: evSkip, Src: []string{string(PhasePending)}, Dst: string(PhaseSkipped)},
}
