package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrClosed is returned by Start when the lifecycle was drained before it
// was started, and by Start after a drain completed.
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
