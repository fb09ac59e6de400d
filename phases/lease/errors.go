package lease

import (
	"context"
	"errors"
	"fmt"
)

// Kind is the class of a refusal or failure of the lease core, which each
// adapter maps to its own wire's code (slotsapi: a gRPC status code,
// cniapi: a CNI error code, one table each). A Kind is an error itself, so
// that callers branch with errors.Is(err, lease.ErrNotFound) on an
// [*Error] of that kind.
type Kind uint8

// The kinds of the core's errors. They follow what a client does about
// each: fix the request, ask someone else, wait, retry.
const (
	// ErrInternal is a failure of the daemon or the host (the zero Kind of
	// an error the core did not classify).
	ErrInternal Kind = iota
	// ErrInvalid: the request is malformed (a name, a TTL, a policy).
	ErrInvalid
	// ErrUnauthenticated: the call did not come through the control
	// surface's guard, which names its caller.
	ErrUnauthenticated
	// ErrDenied: the caller may not do this (the control policy, another
	// principal's lease or attachment, a wrong lease id).
	ErrDenied
	// ErrNotFound: no such slot, attachment or held slot.
	ErrNotFound
	// ErrExists: the request id or key is another's, or names another
	// namespace.
	ErrExists
	// ErrExhausted: a quota, the slots or the state filesystem are full.
	ErrExhausted
	// ErrPrecondition: the slot is not in a state that allows it (not
	// leased, lost, gone meanwhile).
	ErrPrecondition
	// ErrAborted: a concurrent call on the same request is being served:
	// retry.
	ErrAborted
	// ErrUnavailable: the daemon is draining, or could not write what the
	// call needed.
	ErrUnavailable
	// ErrCanceled and ErrDeadline: the caller left, or its deadline passed.
	ErrCanceled
	ErrDeadline
)

var kindNames = [...]string{
	ErrInternal: "internal", ErrInvalid: "invalid", ErrUnauthenticated: "unauthenticated", ErrDenied: "denied",
	ErrNotFound: "not found", ErrExists: "exists", ErrExhausted: "exhausted", ErrPrecondition: "precondition",
	ErrAborted: "aborted", ErrUnavailable: "unavailable", ErrCanceled: "canceled", ErrDeadline: "deadline exceeded",
}

// Error returns the kind's name.
func (k Kind) Error() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind %d", k)
}

// Error is a refusal or failure of the lease core: its kind, the message
// the caller is shown, and the cause when there is one (errors.Is reaches
// it, e.g. slot.ErrIfNameTaken).
type Error struct {
	Kind Kind
	Msg  string
	Err  error
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the cause, if any.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is e's kind.
func (e *Error) Is(target error) bool {
	k, ok := target.(Kind)
	return ok && k == e.Kind
}

// Errorf returns an [*Error] of kind k with the message formatted.
func Errorf(k Kind, format string, a ...any) error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, a...)}
}

// wrapError returns an [*Error] of kind k, showing msg, whose cause is err.
func wrapError(k Kind, err error, msg string) error {
	return &Error{Kind: k, Msg: msg, Err: err}
}

// FromContext returns the error of a call whose context ended (err is
// ctx.Err()): ErrCanceled or ErrDeadline, with the context's message.
func FromContext(err error) error {
	k := ErrCanceled
	if errors.Is(err, context.DeadlineExceeded) {
		k = ErrDeadline
	}
	return &Error{Kind: k, Msg: err.Error(), Err: err}
}

// KindOf returns the kind of err: an [*Error]'s, a context's end, or
// ErrInternal for anything else.
func KindOf(err error) Kind {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e.Kind
	case errors.Is(err, context.Canceled):
		return ErrCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return ErrDeadline
	}
	return ErrInternal
}
