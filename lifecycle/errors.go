package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"
)

// ErrClosed is returned by Start when the lifecycle was drained before it
// was started, and by Start after a drain completed. A start that a drain
// cancelled returns an error that wraps it.
var ErrClosed = errors.New("lifecycle: drained")

// EmptyNameError reports a phase without a name.
type EmptyNameError struct {
	// Index is the phase's position in the declaration.
	Index int
}

func (e *EmptyNameError) Error() string {
	return fmt.Sprintf("phase #%d has an empty name", e.Index)
}

// DuplicateNameError reports two phases with the same name.
type DuplicateNameError struct {
	Name string
}

func (e *DuplicateNameError) Error() string {
	return fmt.Sprintf("phase %q is declared more than once", e.Name)
}

// UnknownDependencyError reports a dependency on a phase that is not declared.
type UnknownDependencyError struct {
	Phase, Dependency string
}

func (e *UnknownDependencyError) Error() string {
	return fmt.Sprintf("phase %q depends on unknown phase %q", e.Phase, e.Dependency)
}

// SelfDependencyError reports a phase that depends on itself.
type SelfDependencyError struct {
	Phase string
}

func (e *SelfDependencyError) Error() string {
	return fmt.Sprintf("phase %q depends on itself", e.Phase)
}

// CycleError reports a dependency cycle. Path starts and ends with the same
// phase: [reclaim storage reclaim] means reclaim depends on storage, which
// depends on reclaim.
type CycleError struct {
	Path []string
}

func (e *CycleError) Error() string {
	return "dependency cycle: " + strings.Join(e.Path, " -> ")
}

// InvalidPhaseError reports a phase whose fields cannot be used, such as a
// missing Run function or a negative timeout.
type InvalidPhaseError struct {
	Phase  string
	Reason string
}

func (e *InvalidPhaseError) Error() string {
	return fmt.Sprintf("phase %q: %s", e.Phase, e.Reason)
}

// PhaseError is returned by Start when a phase failed for good.
type PhaseError struct {
	// Phase is the name of the phase that failed.
	Phase string
	// Attempts is how many times Run was called.
	Attempts int
	// Err is the last attempt's error.
	Err error
}

func (e *PhaseError) Error() string {
	unit := "attempts"
	if e.Attempts == 1 {
		unit = "attempt"
	}
	return fmt.Sprintf("phase %q failed after %d %s: %v", e.Phase, e.Attempts, unit, e.Err)
}

func (e *PhaseError) Unwrap() error { return e.Err }

// AttemptTimeoutError is the error of an attempt that ran past its
// Phase.Timeout. It wraps context.DeadlineExceeded.
type AttemptTimeoutError struct {
	Phase   string
	Attempt int
	Timeout time.Duration
}

func (e *AttemptTimeoutError) Error() string {
	return fmt.Sprintf("attempt %d timed out after %s", e.Attempt, e.Timeout)
}

func (e *AttemptTimeoutError) Unwrap() error { return context.DeadlineExceeded }

// InvalidOptionError reports an [Option] given a value it cannot use, such
// as a negative duration.
type InvalidOptionError struct {
	// Option is the option's name, "WithStopTimeout".
	Option string
	// Reason says what is wrong with the value.
	Reason string
}

func (e *InvalidOptionError) Error() string {
	return fmt.Sprintf("lifecycle: %s: %s", e.Option, e.Reason)
}

// PanicError is a panic recovered from a phase's Run or Stop or from a
// background task. The lifecycle treats it as that function's error; Stack
// is the panicking goroutine's stack, as [runtime/debug.Stack] prints it, so
// a log shows where the panic happened and not only what it said.
type PanicError struct {
	// Value is what was passed to panic.
	Value any
	// Stack is the stack of the goroutine that panicked, taken when the
	// panic was recovered.
	Stack []byte
}

// Error reports the panic's value without the stack: "panic: boom".
func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// Unwrap returns the panic's value when it is an error, so errors.Is and
// errors.As see what was passed to panic.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// recovered turns a recovered panic value into a *PanicError carrying the
// current goroutine's stack. It must be called from the deferred function
// that recovered, so that the stack still shows the panic's frames.
func recovered(v any) *PanicError {
	return &PanicError{Value: v, Stack: debug.Stack()}
}

// StartTimeoutError is the error of a start that ran past
// [WithStartTimeout]. It names every phase still running when the time ran
// out, with how long it had run and how far it had got, which is usually all
// an operator needs to know which step hangs. It wraps
// context.DeadlineExceeded.
type StartTimeoutError struct {
	// Timeout is the bound that passed.
	Timeout time.Duration
	// Running lists the phases that were running or waiting to retry, in
	// declaration order.
	Running []RunningPhase
}

// RunningPhase is a phase caught running by a [StartTimeoutError].
type RunningPhase struct {
	Name string
	// State is running, or retrying while it waits out a backoff.
	State PhaseState
	// Attempt is the current attempt, 1 for the first.
	Attempt int
	// For is how long ago the phase's first attempt began.
	For time.Duration
	// Progress is the current attempt's last report.
	Progress ProgressSnapshot
}

// Error reads "start timed out after 10m0s: phase reclaim running for 9m58s
// at 1200/5000 namespaces", one clause per phase still running.
func (e *StartTimeoutError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "start timed out after %s", e.Timeout)
	for i, p := range e.Running {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "phase %s %s for %s", p.Name, p.State, roundForHumans(p.For))
		if p.Attempt > 1 {
			fmt.Fprintf(&b, " (attempt %d)", p.Attempt)
		}
		if s := p.Progress.String(); s != "" {
			b.WriteString(" at ")
			b.WriteString(s)
		}
	}
	return b.String()
}

func (e *StartTimeoutError) Unwrap() error { return context.DeadlineExceeded }

// roundForHumans keeps the digits a person reads in an error message:
// "9m58s", "1.5s", "12ms".
func roundForHumans(d time.Duration) time.Duration {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
