package lifecycle

import (
	"time"

	"go.opentelemetry.io/otel/trace"
)

// An Option configures a [Lifecycle].
type Option func(*options)

type options struct {
	maxParallel      int
	stopTimeout      time.Duration
	progressInterval time.Duration
	tracerProvider   trace.TracerProvider
}

func defaultOptions() options {
	return options{
		stopTimeout:      30 * time.Second,
		progressInterval: 100 * time.Millisecond,
	}
}

// WithMaxParallel bounds how many phases run at once. Zero or less means no
// bound.
func WithMaxParallel(n int) Option {
	return func(o *options) { o.maxParallel = n }
}

// WithStopTimeout sets how long a stop function may run when its phase sets
// no StopTimeout of its own. The default is 30 seconds.
func WithStopTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.stopTimeout = d
		}
	}
}

// WithProgressInterval sets how often at most progress reports are published
// to observers. State changes are always published at once. The default is
// 100ms.
func WithProgressInterval(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.progressInterval = d
		}
	}
}

// WithTracerProvider makes the lifecycle emit spans through tp. Without it no
// spans are recorded.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}
