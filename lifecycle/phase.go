package lifecycle

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"time"
)

// A Phase is one named step of a startup.
//
// Its zero-valued fields have the meaning each documents; a field cannot tell
// an explicit zero from an unset one, so a zero means "not bounded" or "the
// lifecycle's setting" only where a literal zero could not work (a Timeout
// of zero would fail every attempt at once).
//
// Run does the work and reports how far along it is through the [Progress]
// it is given. Run's ctx is cancelled when the attempt times out, when a
// sibling phase fails or when the start is cancelled; Run must return soon
// after. A phase is retried according to Retry unless its error is marked
// with [Permanent].
//
// Stop, when set, undoes or shuts down what Run built. It is called once for
// every phase that succeeded: in reverse dependency order when a later phase
// fails, or when the lifecycle drains.
type Phase struct {
	// Name identifies the phase in errors, snapshots, spans and health
	// endpoints. It must be unique and non-empty.
	Name string
	// DependsOn names the phases that must succeed before this one starts.
	DependsOn []string
	// Run does the phase's work. It is required.
	Run func(ctx context.Context, p *Progress) error
	// Stop undoes Run. Optional.
	Stop func(ctx context.Context) error
	// Timeout bounds each attempt of Run; an attempt that runs past it
	// fails with an [*AttemptTimeoutError] and may be retried. Zero means
	// no bound (the whole start can still be bounded with
	// [WithStartTimeout]).
	Timeout time.Duration
	// StopTimeout bounds Stop. Zero means the lifecycle's bound, set with
	// [WithStopTimeout] (which can be zero: no grace).
	StopTimeout time.Duration
	// Retry says whether and how a failed attempt is retried. The zero
	// value runs the phase once.
	Retry RetryPolicy
	// PolicyFrom, when set, gives the phase's Timeout and Retry at run
	// time, in place of those fields (which must then be zero): a
	// service whose timeouts live in its configuration file reads them
	// in a config phase and hands them over here, as app.Config.PortFrom
	// hands over the port. It is called once, as the phase's first
	// attempt begins, after every phase it depends on has succeeded, so
	// what it returns may come from those phases and no other: the
	// dependency graph says which phase may set which. The policy is
	// checked as New checks the fields before Run is called; a policy New
	// would refuse, or an error, fails the phase at once, not retried,
	// with a [*PolicyError]. [Phase.WorstCase] cannot know it beforehand.
	PolicyFrom func() (AttemptBounds, error)
}

// AttemptBounds is how a phase's attempts are bounded and retried, as
// [Phase.PolicyFrom] gives it at run time.
type AttemptBounds struct {
	// Timeout and Retry mean what Phase's fields of those names mean.
	Timeout time.Duration
	Retry   RetryPolicy
}

// problems lists what is wrong with the policy, as New words it.
func (p AttemptBounds) problems() []string {
	var out []string
	if p.Timeout < 0 {
		out = append(out, "negative Timeout")
	}
	if p.Retry.Backoff < 0 || p.Retry.MaxBackoff < 0 {
		out = append(out, "negative retry backoff")
	}
	if p.Retry.Attempts < 0 {
		out = append(out, "negative retry attempts")
	}
	if m := p.Retry.Multiplier; m != 0 && !(m >= 1 && !math.IsInf(m, 1)) { // also NaN
		out = append(out, "retry multiplier below 1 or not finite")
	}
	if j := p.Retry.Jitter; !(j >= 0 && j <= 1) {
		out = append(out, "retry jitter outside [0, 1]")
	}
	return out
}

// RetryPolicy is a bounded exponential backoff with jitter. The zero value
// makes a single attempt. [New] rejects a negative or out-of-range field
// with a [*DeclarationError] rather than correcting it.
type RetryPolicy struct {
	// Attempts is the total number of attempts, the first included. Zero
	// means 1: a phase always runs at least once.
	Attempts int
	// Backoff is the wait before the second attempt. Zero means none: a
	// failed attempt is retried at once.
	Backoff time.Duration
	// MaxBackoff caps the wait between attempts. Zero means no cap (a cap
	// of zero is Backoff zero).
	MaxBackoff time.Duration
	// Multiplier grows the wait after each attempt. Zero means 2; 1 keeps
	// the wait constant; values between 0 and 1 are rejected.
	Multiplier float64
	// Jitter spreads each wait uniformly over ±Jitter of its length, so that
	// many daemons restarting together do not retry in step. It must be in
	// [0, 1]; zero means no jitter.
	Jitter float64
}

func (r RetryPolicy) attempts() int {
	return max(r.Attempts, 1)
}

// delay returns the wait after the given failed attempt (1-based).
func (r RetryPolicy) delay(attempt int) time.Duration {
	d := r.backoff(attempt)
	if j := r.Jitter; j > 0 {
		d *= 1 + j*(2*rand.Float64()-1)
	}
	return saturated(d)
}

// backoff is the wait after the given failed attempt before jitter, in
// nanoseconds.
func (r RetryPolicy) backoff(attempt int) float64 {
	d := float64(r.Backoff)
	m := r.Multiplier
	if m == 0 {
		m = 2
	}
	for i := 1; i < attempt; i++ {
		d *= m
		if r.MaxBackoff > 0 && d >= float64(r.MaxBackoff) {
			break
		}
	}
	if r.MaxBackoff > 0 && d > float64(r.MaxBackoff) {
		d = float64(r.MaxBackoff)
	}
	return d
}

// saturated is d nanoseconds as a Duration, the longest one when it does
// not fit.
func saturated(d float64) time.Duration {
	if d >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(d)
}

// WorstCase is the longest the phase can run before it fails for good:
// every attempt running out its Timeout, and every wait between attempts
// at its longest (the Backoff grown by the Multiplier, capped by
// MaxBackoff, at the top of its Jitter). bounded is false when Timeout is
// zero, since nothing then bounds an attempt, and when PolicyFrom gives
// the policy only at run time. A phase that succeeds, or
// fails with a [Permanent] error, ends sooner. A phase of 5 attempts of
// 300ms each, 50ms apart doubling with 10% jitter, is bounded by 2.325s:
//
//	(5 × 300ms) + (50 + 100 + 200 + 400ms) × 1.1
func (p Phase) WorstCase() (d time.Duration, bounded bool) {
	if p.Timeout <= 0 || p.PolicyFrom != nil {
		return 0, false
	}
	n := p.Retry.attempts()
	total := float64(n) * float64(p.Timeout)
	for i := 1; i < n; i++ {
		total += p.Retry.backoff(i) * (1 + p.Retry.Jitter)
	}
	return saturated(total), true
}

// permanentError marks an error that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err so that the phase that returned it is not retried.
// The error keeps its message and its chain: errors.Is and errors.As see
// through it. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// isPermanent reports whether err, or an error it wraps, was marked with
// [Permanent].
func isPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}
