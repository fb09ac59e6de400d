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

// DeclarationError is one problem [New] found in the phases or the options
// it was given: a phase without a name, declared twice or with a field it
// cannot use (no Run, a negative timeout, a retry policy out of range), a
// dependency unknown, on the phase itself, repeated or part of a cycle, an
// [Option] given a value it cannot use. New reports every problem at once,
// one DeclarationError each, joined with errors.Join; each reads on one
// line, such as "dependency cycle: reclaim -> storage -> reclaim".
type DeclarationError struct {
	// Phase is the phase at fault; for a cycle, the one of its phases
	// declared first. Empty for a phase without a name and for an option.
	Phase string
	msg   string
}

func (e *DeclarationError) Error() string { return e.msg }

// declarationError is a problem of phase, described by format and args.
func declarationError(phase, format string, args ...any) *DeclarationError {
	return &DeclarationError{Phase: phase, msg: fmt.Sprintf(format, args...)}
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

// PolicyError is the error of a phase whose [Phase.PolicyFrom] failed or
// gave a policy New would refuse: a configuration error, which fails the
// phase at once, not retried, before its Run is called.
type PolicyError struct {
	// Phase is the phase whose policy it was.
	Phase string
	// Err is PolicyFrom's error, or what is wrong with its policy.
	Err error
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("phase %q: its policy from PolicyFrom: %v", e.Phase, e.Err)
}

func (e *PolicyError) Unwrap() error { return e.Err }

// AttemptTimeoutError is the error of an attempt that ran past its
// Phase.Timeout. It wraps context.DeadlineExceeded and the error the
// attempt itself returned, which usually names what it was waiting for
// ("Get http://registry/v2/: context deadline exceeded").
type AttemptTimeoutError struct {
	Phase   string
	Attempt int
	Timeout time.Duration
	// Err is what the attempt's Run returned when its deadline passed; nil
	// when it returned the context's own error and nothing more.
	Err error
}

// Error reads "attempt 5 timed out after 300ms: Get "http://…/v2/":
// context deadline exceeded", the attempt's own error last.
func (e *AttemptTimeoutError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("attempt %d timed out after %s", e.Attempt, e.Timeout)
	}
	return fmt.Sprintf("attempt %d timed out after %s: %v", e.Attempt, e.Timeout, e.Err)
}

// Unwrap returns context.DeadlineExceeded and the attempt's own error, so
// that errors.Is and errors.As see both.
func (e *AttemptTimeoutError) Unwrap() []error {
	if e.Err == nil {
		return []error{context.DeadlineExceeded}
	}
	return []error{context.DeadlineExceeded, e.Err}
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
