package phasetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// DefaultTimeout bounds [Harness.RequireStart] and [Harness.RequireStop]
// unless the Harness's Timeout says otherwise: far longer than any unit
// test's start should take, short enough that a hung one fails the test
// instead of the whole binary.
const DefaultTimeout = time.Minute

// Harness is a lifecycle under test. It embeds the *lifecycle.Lifecycle, so
// every method of it is at hand (h.Events(0), h.Snapshot(), h.Warn, …), and
// ties the lifecycle's end to the test's (its Drain is the Harness's own,
// which for a wrapped Runner stops the Runner as a whole): the drain is registered with
// t.Cleanup when the Harness is made, so a test that fails half-way still
// stops every phase and background task it started. When the test has
// failed, the cleanup logs the event log.
type Harness struct {
	*lifecycle.Lifecycle
	// Timeout bounds RequireStart and RequireStop, and the drain at
	// cleanup. New sets it to DefaultTimeout; zero means no bound.
	Timeout time.Duration
	// KeepDrainDelay stops a wrapped Runner that has a drain delay (an
	// *app.App) with it. By default RequireStop, Drain and the cleanup
	// skip it: in a test no checker routes traffic that the delay would
	// let finish, and every test would wait it out (5 s with
	// app.DefaultConfig). Set it in a test of what a checker sees while
	// the port drains.
	KeepDrainDelay bool

	t       testing.TB
	stopped bool
	started chan struct{}               // closed when a StartInBackground's start returned; nil if none
	start   func(context.Context) error // the lifecycle's Start, or a Runner's
	stop    func(context.Context) error // the lifecycle's Drain, or a Runner's Stop
}

// Runner is a program built on a lifecycle that starts and stops as a
// whole, such as an *app.App: its Start runs the phases (and binds its
// port), its Stop drains the port and then the lifecycle. A Runner that
// also has a SkipDrainDelay method (an *app.App does) is stopped without
// its drain delay unless [Harness.KeepDrainDelay] is set.
type Runner interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
	Lifecycle() *lifecycle.Lifecycle
}

// drainDelaySkipper is a Runner whose next stop can skip its drain delay.
type drainDelaySkipper interface {
	SkipDrainDelay()
}

// New makes a lifecycle of phases with opts, failing the test at once if
// the declaration is invalid, and registers its drain with t.Cleanup.
func New(t testing.TB, phases []lifecycle.Phase, opts ...lifecycle.Option) *Harness {
	t.Helper()
	lc, err := lifecycle.New(phases, opts...)
	if err != nil {
		t.Fatalf("phasetest: lifecycle.New: %v", err)
	}
	h := &Harness{Lifecycle: lc, Timeout: DefaultTimeout, t: t, start: lc.Start, stop: lc.Drain}
	t.Cleanup(h.cleanup)
	return h
}

// Wrap ties r to the test as [New] does a lifecycle: r's Stop is registered
// with t.Cleanup at once, [Harness.RequireStart] and [Harness.RequireStop]
// call r's Start and Stop, and the embedded Lifecycle is r's, for the
// waits and assertions:
//
//	a, err := app.New(cfg, phases...)
//	…
//	h := phasetest.Wrap(t, a).RequireStart()
//	phasetest.AssertOrder(t, h.Events(0), "config", "migrate", "serve")
func Wrap(t testing.TB, r Runner) *Harness {
	t.Helper()
	h := &Harness{Lifecycle: r.Lifecycle(), Timeout: DefaultTimeout, t: t, start: r.Start}
	h.stop = func(ctx context.Context) error {
		if s, ok := r.(drainDelaySkipper); ok && !h.KeepDrainDelay {
			s.SkipDrainDelay()
		}
		return r.Stop(ctx)
	}
	t.Cleanup(h.cleanup)
	return h
}

// RequireStart starts the lifecycle and fails the test with t.Fatalf if the
// start fails or does not end within the Timeout, saying which phases were
// still running and listing the events. It returns h, so that
//
//	h := phasetest.New(t, phases).RequireStart()
//
// reads as one step.
func (h *Harness) RequireStart() *Harness {
	h.t.Helper()
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	if h.Timeout > 0 {
		// Name what hangs while it still runs: once the start is
		// cancelled, nothing is running any more.
		timer := time.AfterFunc(h.Timeout, func() {
			cancel(fmt.Errorf("phasetest: start did not end within %s%s", h.Timeout, running(h.Snapshot())))
		})
		defer timer.Stop()
	}
	if err := h.start(ctx); err != nil {
		h.t.Fatalf("phasetest: start failed: %v\n%s", err, formatLog(h.Events(0)))
	}
	return h
}

// StartInBackground starts the lifecycle (or the wrapped Runner) in a
// goroutine the Harness owns and returns at once, for a test that watches
// the start from outside: its health answers, its progress, a drain during
// the start. The channel receives the start's result and is then closed.
// A stop (RequireStop, Drain or the cleanup) ends a start still running and
// waits for it to return. Call it at most once, instead of RequireStart:
//
//	h := phasetest.Wrap(t, a)
//	done := h.StartInBackground()
//	… // the port answers NOT_SERVING
//	if err := <-done; err != nil { t.Fatal(err) }
func (h *Harness) StartInBackground() <-chan error {
	h.t.Helper()
	if h.started != nil {
		h.t.Fatalf("phasetest: StartInBackground called twice")
	}
	h.started = make(chan struct{})
	result := make(chan error, 1)
	go func() {
		defer close(h.started)
		defer close(result)
		result <- h.start(context.Background())
	}()
	return result
}

// Drain stops what the Harness runs as RequireStop does, returning the
// error instead of failing the test. For a wrapped Runner it is the
// Runner's Stop (an App's port drained, then its lifecycle), not only the
// embedded Lifecycle's Drain, which would leave the port bound.
func (h *Harness) Drain(ctx context.Context) error {
	h.stopped = true
	err := h.stop(ctx)
	h.awaitStart()
	return err
}

// awaitStart waits for a StartInBackground's start to return: the stop
// has ended it, or it had already.
func (h *Harness) awaitStart() {
	if h.started != nil {
		<-h.started
	}
}

// RequireStop drains the lifecycle and fails the test with t.Fatalf if the
// drain returns an error (a stop function failed) or does not end within
// the Timeout. The cleanup then has nothing left to do. A wrapped App's
// drain delay is skipped unless [Harness.KeepDrainDelay] is set.
func (h *Harness) RequireStop() {
	h.t.Helper()
	h.stopped = true
	ctx, cancel := h.context()
	defer cancel()
	err := h.stop(ctx)
	h.awaitStart()
	if err != nil {
		h.t.Fatalf("phasetest: stop failed: %v\n%s", err, formatLog(h.Events(0)))
	}
}

func (h *Harness) cleanup() {
	if !h.stopped {
		ctx, cancel := h.context()
		defer cancel()
		if err := h.stop(ctx); err != nil {
			h.t.Errorf("phasetest: stop at cleanup: %v", err)
		}
		h.awaitStart()
	}
	if h.t.Failed() {
		h.t.Logf("phasetest: %s", formatLog(h.Events(0)))
	}
}

func (h *Harness) context() (context.Context, context.CancelFunc) {
	if h.Timeout <= 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeoutCause(context.Background(), h.Timeout,
		fmt.Errorf("phasetest: Harness.Timeout of %s passed", h.Timeout))
}

// running names the phases a snapshot shows running, for a start that
// failed or hung.
func running(s lifecycle.Snapshot) string {
	cur := s.Current()
	if len(cur) == 0 {
		return ""
	}
	parts := make([]string, len(cur))
	for i, p := range cur {
		parts[i] = fmt.Sprintf("%s %s for %s", p.Name, p.State, p.Duration().Round(time.Millisecond))
		if pr := p.Progress.String(); pr != "" {
			parts[i] += " at " + pr
		}
	}
	return ": still running: " + strings.Join(parts, "; ")
}
