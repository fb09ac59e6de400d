package lifecycle

import (
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// An Option configures a [Lifecycle]. A value an option cannot use makes
// [New] fail with a [*DeclarationError]; no option silently replaces a
// value it was given, and an explicit zero means zero wherever zero means
// something (each option says what its zero does).
type Option func(*options)

type options struct {
	maxParallel      int
	stopTimeout      time.Duration
	startTimeout     time.Duration // zero: no bound
	progressInterval time.Duration
	tracerProvider   trace.TracerProvider
	hook             func(Event)
	spanAttributes   func(SpanEnd) []attribute.KeyValue
	errs             []error
}

// Defaults of the options not given to [New].
const (
	// DefaultStopTimeout bounds a stop function when neither its Phase nor
	// [WithStopTimeout] says otherwise.
	DefaultStopTimeout = 30 * time.Second
	// DefaultProgressInterval is how often at most progress reports reach
	// [Lifecycle.Subscribe] observers without [WithProgressInterval].
	DefaultProgressInterval = 100 * time.Millisecond
)

func defaultOptions() options {
	return options{
		stopTimeout:      DefaultStopTimeout,
		progressInterval: DefaultProgressInterval,
	}
}

func (o *options) invalid(option, format string, args ...any) {
	o.errs = append(o.errs, declarationError("", "lifecycle: %s: %s", option, fmt.Sprintf(format, args...)))
}

// WithMaxParallel bounds how many phases run at once. Zero or less means no
// bound: a bound of zero phases could never start anything.
func WithMaxParallel(n int) Option {
	return func(o *options) { o.maxParallel = n }
}

// WithStopTimeout sets how long a stop function may run when its phase sets
// no StopTimeout of its own; without it the bound is [DefaultStopTimeout].
// Zero means no grace: stop functions are called with a context that is
// already done, so one that honours it shuts down at once (a server closes
// its connections instead of draining them). The bound is the stop
// function's context's deadline; the lifecycle still waits for the function
// to return. A negative duration is an error.
func WithStopTimeout(d time.Duration) Option {
	return nonNegative("WithStopTimeout", d, func(o *options) *time.Duration { return &o.stopTimeout })
}

// WithStartTimeout bounds the whole start, from Start until every phase has
// succeeded. When it passes, the start fails as if a phase had failed:
// running phases are cancelled, pending ones skipped, succeeded ones rolled
// back, and Start returns a [*StartTimeoutError] that names each phase still
// running and its progress. Without this option, or with zero, the start has
// no bound of its own (a start that must end at once cannot succeed, so zero
// cannot mean that); the ctx given to Start can still end it. A negative
// duration is an error.
func WithStartTimeout(d time.Duration) Option {
	return nonNegative("WithStartTimeout", d, func(o *options) *time.Duration { return &o.startTimeout })
}

// WithProgressInterval sets how often at most progress reports are published
// to [Lifecycle.Subscribe] observers; without it the interval is
// [DefaultProgressInterval]. Zero publishes every report at once, which
// costs a lock and a snapshot per report while someone subscribes. State
// changes are always published at once. A negative duration is an error.
func WithProgressInterval(d time.Duration) Option {
	return nonNegative("WithProgressInterval", d, func(o *options) *time.Duration { return &o.progressInterval })
}

// WithTracerProvider makes the lifecycle emit spans through tp. Without it,
// or with nil, no spans are recorded.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}

// SpanEnd is what [WithSpanAttributes] is told of a span as it ends.
type SpanEnd struct {
	// Name is the phase's or the task's; empty for the start's own span,
	// "startup", which ends once the start is over (serving, failed or
	// rolled back).
	Name string
	// Task is true for a background task's span.
	Task bool
	// Took is how long it ran: a phase's every attempt and backoff, or
	// the whole start.
	Took time.Duration
}

// WithSpanAttributes adds attrs(end) to each span of the start as it
// ends: the start's own, each phase's and each background task's. It is
// for what the lifecycle does not know of them, such as what each usually
// takes (an App's start history), which may be known only once a phase
// has run. attrs runs on the goroutine of the phase, the task or the
// start, outside the lifecycle's lock, and must be quick; nil adds
// nothing.
func WithSpanAttributes(attrs func(SpanEnd) []attribute.KeyValue) Option {
	return func(o *options) { o.spanAttributes = attrs }
}

// WithEventHook hands every [Event] to hook: each exactly once, in sequence
// order, one call at a time, none dropped, whatever hook's speed. It is the
// in-process way to log or record a lifecycle's transitions; nil means no
// hook.
//
// The hook runs on a goroutine of the lifecycle's own, never on the one that
// made the transition and never under the lifecycle's lock, so it may call
// back into the Lifecycle: Snapshot, Events, Warn and Fail, and also Drain or
// Wait, which wait for the runner, the phases or the stop functions — which
// is why none of those ever waits for the hook. A slow hook therefore never
// slows a start or a drain; it falls behind, and the events it has yet to see
// wait in the lifecycle's log (see [Lifecycle.Events]), which is kept for the
// lifecycle's life anyway, so falling behind costs no memory and loses
// nothing. When Start or Drain returns, the hook may still be catching up,
// while the log already holds every event they caused: a program that must
// not exit before its hook has seen the end (a logger) has the hook signal
// when it is handed the final event (see [Event.Final] and
// ExampleWithEventHook).
//
// A panic in hook is not recovered: like any goroutine's, it ends the
// program.
func WithEventHook(hook func(Event)) Option {
	return func(o *options) { o.hook = hook }
}

// nonNegative is the option called name that sets the duration field
// returns to d, and is an error for a negative d.
func nonNegative(name string, d time.Duration, field func(*options) *time.Duration) Option {
	return func(o *options) {
		if d < 0 {
			o.invalid(name, "negative duration %s", d)
			return
		}
		*field(o) = d
	}
}
