package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/looplab/fsm"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/phasegate/phasegate/internal/eventlog"
)

// errDrainDuringStart is the cause given to a start that a drain cancelled.
var errDrainDuringStart = fmt.Errorf("%w during the start", ErrClosed)

// Lifecycle runs a validated set of phases. Create one with [New]; all its
// methods are safe for concurrent use.
type Lifecycle struct {
	opts   options
	tracer trace.Tracer
	phases []*phaseRun // declaration order; the graph never changes after New

	hasWatchers     atomic.Bool
	progressPending atomic.Bool

	mu           sync.Mutex
	fsm          *fsm.FSM // the lifecycle's state: the one copy, read with Current
	since        time.Time
	history      []Transition // every state entered after created, in order
	warnings     []Warning    // by name, in the order first set
	started      time.Time
	err          error
	degraded     bool
	closed       bool      // Drain was called
	completed    []int     // succeeded phases whose Stop has not run, in completion order
	tasks        []*task   // background tasks, in start order
	eta          estimator // fed every snapshot taken (eta.go)
	watchers     map[*watcher]struct{}
	seq          atomic.Uint64 // written under mu, read without it by Seq
	lastProgress time.Time     // last progress-only publish
	progressTmr  *time.Timer   // trailing publish of throttled progress
	cancelStart  context.CancelCauseFunc
	startHalted  bool // a phase failed, the start timed out or a drain began: no phase begins any more
	tasksCtx     context.Context
	cancelTasks  context.CancelFunc
	startDone    chan struct{} // closed when Start's outcome is known
	startErr     error
	startTimer   *time.Timer   // WithStartTimeout's; nil without it
	drainDone    chan struct{} // closed when Drain finished; nil before
	drainErr     error
	done         chan struct{} // closed when failed or finished; see Done
	doneClosed   bool

	// The event log (event.go).
	events     []Event
	eventsDone bool          // the final event is in: nothing more is recorded
	eventWake  eventlog.Wake // readers waiting for the next event
	delivered  int           // how many events the hook has been handed
	delivering bool          // a goroutine is handing events to the hook
}

// phaseRun is a phase and what the runner knows about it. Fields below the
// Phase are guarded by Lifecycle.mu, except progress which is atomic.
type phaseRun struct {
	Phase
	index      int
	deps       []int
	dependents []int
	progress   Progress

	fsm      *fsm.FSM // the phase's state: the one copy, read with Current
	attempts int
	// worstCase is Phase.WorstCase once known: from New, or once
	// PolicyFrom gave the policy; zero while nothing bounds the phase.
	worstCase time.Duration
	started   time.Time
	attempt   time.Time // when the current attempt began
	ended     time.Time
	err       error
	spanCtx   trace.SpanContext
	deferred  []deferredTask // handed over by the current attempt
}

type deferredTask struct {
	name string
	fn   func(context.Context, *Progress) error
}

// New validates phases and returns a lifecycle ready to [Lifecycle.Start].
// Every problem in the declaration and the options is reported at once,
// joined with errors.Join, one [*DeclarationError] each.
func New(phases []Phase, opts ...Option) (*Lifecycle, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := errors.Join(append(validate(phases), o.errs...)...); err != nil {
		return nil, err
	}
	tp := o.tracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	l := &Lifecycle{
		opts:      o,
		tracer:    tp.Tracer("github.com/phasegate/phasegate/lifecycle"),
		phases:    make([]*phaseRun, len(phases)),
		fsm:       newLifecycleFSM(),
		since:     time.Now(),
		eta:       newEstimator(etaWindow, etaMinSpan),
		startDone: make(chan struct{}),
		done:      make(chan struct{}),
		// Room for a start without retries and its drain: the log then
		// never grows on the way.
		events: make([]Event, 0, 2*len(phases)+4),
	}
	index := make(map[string]int, len(phases))
	for i, p := range phases {
		index[p.Name] = i
	}
	for i, p := range phases {
		// Our own copy: the graph must not change under the runner if the
		// caller reuses its slice.
		p.DependsOn = slices.Clip(slices.Clone(p.DependsOn))
		r := &phaseRun{Phase: p, index: i, fsm: newPhaseFSM()}
		if d, bounded := p.WorstCase(); bounded {
			r.worstCase = d
		}
		r.progress.lc, r.progress.phase = l, r
		for _, d := range p.DependsOn {
			r.deps = append(r.deps, index[d])
		}
		l.phases[i] = r
	}
	for _, r := range l.phases {
		for _, d := range r.deps {
			l.phases[d].dependents = append(l.phases[d].dependents, r.index)
		}
	}
	return l, nil
}

func newLifecycleFSM() *fsm.FSM { return fsm.NewFSM(string(StateCreated), lifecycleEvents, nil) }
func newPhaseFSM() *fsm.FSM     { return fsm.NewFSM(string(PhasePending), phaseEvents, nil) }

// State returns the lifecycle's current state.
func (l *Lifecycle) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return State(l.fsm.Current())
}

// Start runs the phases and blocks until every phase succeeded (the lifecycle
// is then serving and Start returns nil) or until startup failed. On failure
// the lifecycle is left in state failed, after the stop functions of the
// phases that had succeeded ran; the error is a *[PhaseError] when a phase
// failed for good, a *[StartTimeoutError] when [WithStartTimeout] passed, or
// wraps ctx's cause when ctx ended first. Errors of the rollback's stop
// functions are joined to it.
//
// Calling Start again, or concurrently, waits for and returns the outcome of
// the first call. Once [Lifecycle.Drain] was called, Start returns
// [ErrClosed]; a start that a drain cancelled returns an error wrapping
// [ErrClosed] too, and the lifecycle is then draining, not failed.
func (l *Lifecycle) Start(ctx context.Context) error {
	l.mu.Lock()
	if l.closed && State(l.fsm.Current()) != StateStarting {
		l.mu.Unlock()
		return ErrClosed
	}
	if State(l.fsm.Current()) != StateCreated {
		l.mu.Unlock()
		select {
		case <-l.startDone:
			return l.startErr
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	l.cancelStart = cancel
	l.tasksCtx, l.cancelTasks = context.WithCancel(context.WithoutCancel(ctx))
	l.started = time.Now()
	if d := l.opts.startTimeout; d > 0 {
		l.startTimer = time.AfterFunc(d, l.startTimedOut)
	}
	l.transitionLocked(evStart)
	l.mu.Unlock()

	err := l.run(runCtx)
	cancel(nil)

	l.mu.Lock()
	if l.startTimer != nil {
		l.startTimer.Stop()
	}
	l.startErr = err
	l.mu.Unlock()
	close(l.startDone)
	return err
}

// startTimedOut ends a start that ran past WithStartTimeout, naming the
// phases that were still running.
func (l *Lifecycle) startTimedOut() {
	l.mu.Lock()
	if State(l.fsm.Current()) != StateStarting {
		l.mu.Unlock()
		return
	}
	now := time.Now()
	err := &StartTimeoutError{Timeout: l.opts.startTimeout}
	for _, r := range l.phases {
		if s := PhaseState(r.fsm.Current()); s == PhaseRunning || s == PhaseRetrying {
			err.Running = append(err.Running, RunningPhase{
				Name:     r.Name,
				State:    s,
				Attempt:  r.attempts,
				For:      now.Sub(r.started),
				Progress: r.progress.snapshot(),
			})
		}
	}
	l.startHalted = true
	cancel := l.cancelStart
	l.mu.Unlock()
	cancel(err)
}

// Done returns a channel that is closed when the lifecycle can no longer
// serve: when it enters failed (a start that failed or timed out, or
// [Lifecycle.Fail]), when it enters stopped, or when Drain was called before
// Start (the lifecycle then stays created and never starts). A drain, during
// the start or after it, closes Done when the lifecycle is stopped, once the
// stop functions ran. A program that serves until a signal or until it
// cannot serve selects on Done and the signal, then drains.
func (l *Lifecycle) Done() <-chan struct{} { return l.done }

// Err returns why the lifecycle failed: the start's failure (a *PhaseError,
// a *StartTimeoutError, ctx's cause) or the cause given to Fail. It is nil
// while the lifecycle has not failed, which includes every orderly end: a
// drain after serving, a drain that cancelled the start, a drain before the
// start. Errors of stop functions are not failures of the lifecycle; Drain
// and Start return them.
func (l *Lifecycle) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Wait blocks until [Lifecycle.Done] is closed and returns [Lifecycle.Err],
// or returns ctx's cause if ctx ends first.
func (l *Lifecycle) Wait(ctx context.Context) error {
	select {
	case <-l.done:
		return l.Err()
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// closeDoneLocked closes Done once.
func (l *Lifecycle) closeDoneLocked() {
	if !l.doneClosed {
		l.doneClosed = true
		close(l.done)
	}
}

// Fail moves a serving lifecycle to failed for a fatal fault found after
// startup, such as a background loop the daemon cannot run without. The stop
// functions run at the next [Lifecycle.Drain]. Fail reports an error, and
// changes nothing, when the lifecycle is not serving.
func (l *Lifecycle) Fail(cause error) error {
	if cause == nil {
		cause = errors.New("unspecified fault")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := State(l.fsm.Current()); s != StateServing {
		return fmt.Errorf("lifecycle: cannot fail from state %s", s)
	}
	l.err = cause
	l.transitionLocked(evFail)
	l.cancelTasks()
	return nil
}

// Drain shuts the lifecycle down: it goes to draining, background tasks are
// cancelled, the stop functions of the phases that succeeded run in reverse
// dependency order, each under its own timeout and each after the tasks its
// phase deferred have returned (the tasks have one stop timeout in all),
// and the lifecycle ends stopped. A drain that arrives while starting goes to draining at once and
// cancels the start: running phases are cancelled, pending ones skipped, and
// the stops of those that succeeded run as part of the drain. Drain before
// Start only makes the lifecycle refuse to start.
//
// Drain returns the stop functions' errors, joined, or ctx's cause if ctx ends
// first; ending ctx also cancels the stop functions still running. Calling
// Drain again, or concurrently, waits for and returns the first call's result.
func (l *Lifecycle) Drain(ctx context.Context) error {
	l.mu.Lock()
	l.closed = true
	switch State(l.fsm.Current()) {
	case StateCreated:
		// It will never start: nothing can happen to it any more.
		l.finishEventsLocked()
		l.closeDoneLocked()
		l.mu.Unlock()
		return nil
	case StateStarting:
		// Draining from now on, whatever the phases still do: checkers
		// must read an orderly stop, not a failed start.
		l.transitionLocked(evDrain)
		l.startHalted = true
		l.cancelStart(errDrainDuringStart)
	}
	if !isClosed(l.startDone) {
		// The start is still running, or rolling back after a failure:
		// its rollback and the drain must not pop stops concurrently,
		// which would stop a dependency before its dependent.
		l.mu.Unlock()
		select {
		case <-l.startDone:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		l.mu.Lock()
	}
	if l.drainDone != nil {
		done := l.drainDone
		l.mu.Unlock()
		select {
		case <-done:
			return l.drainResult()
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	l.drainDone = make(chan struct{})
	if State(l.fsm.Current()) == StateServing {
		l.transitionLocked(evDrain)
	}
	l.cancelTasks()
	l.mu.Unlock()

	ctx, span := l.tracer.Start(ctx, "drain")
	err := l.stopCompleted(ctx)
	recordOutcome(span, err)
	span.End()

	l.mu.Lock()
	l.transitionLocked(evStop)
	l.finishEventsLocked()
	if l.progressTmr != nil {
		l.progressTmr.Stop()
	}
	l.drainErr = err
	close(l.drainDone)
	l.mu.Unlock()
	return err
}

// isClosed reports, without waiting, whether ch is closed: Drain asks it
// of startDone to learn, under the lock, whether a start still runs. It is
// the library's one copy of the idiom (network/slot's twin was removed).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (l *Lifecycle) drainResult() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.drainErr
}

// stopCompleted runs the stop functions of succeeded phases, latest
// completion first, which is a reverse dependency order: a phase completes
// only after all its dependencies did. Each stop runs once, whoever calls.
//
// Before a phase's Stop, the background tasks it deferred (cancelled
// already) are waited for: a task uses what its phase made, which the Stop
// closes. The tasks get one stop timeout in all, from here, to return,
// besides ctx; a phase whose tasks are still running then is stopped
// anyway, and the error names them.
func (l *Lifecycle) stopCompleted(ctx context.Context) error {
	tasksCtx, cancel := ctx, context.CancelFunc(func() {})
	if d := l.opts.stopTimeout; d > 0 {
		tasksCtx, cancel = context.WithTimeoutCause(ctx, d, fmt.Errorf("stop timeout %s passed", d))
	}
	defer cancel()
	var errs []error
	for {
		l.mu.Lock()
		if len(l.completed) == 0 {
			l.mu.Unlock()
			return errors.Join(errs...)
		}
		r := l.phases[l.completed[len(l.completed)-1]]
		l.completed = l.completed[:len(l.completed)-1]
		l.mu.Unlock()
		if err := l.waitTasks(tasksCtx, r.Name); err != nil {
			errs = append(errs, err)
		}
		if r.Stop == nil {
			continue
		}
		if err := l.stopPhase(ctx, r); err != nil {
			errs = append(errs, err)
		}
	}
}

// hurriedGrace is how long waitTasks still waits, once its ctx has ended,
// for tasks to return by themselves.
const hurriedGrace = 50 * time.Millisecond

// waitTasks waits until the tasks phase deferred have returned, or ctx
// ends; it then names those still running.
func (l *Lifecycle) waitTasks(ctx context.Context, phase string) error {
	l.mu.Lock()
	var tasks []*task
	for _, t := range l.tasks {
		if t.phase == phase {
			tasks = append(tasks, t)
		}
	}
	l.mu.Unlock()
	var running []string
	var grace <-chan time.Time
	for _, t := range tasks {
		select {
		case <-t.done:
			continue
		case <-ctx.Done():
		}
		// A task whose ctx was cancelled a moment ago may be returning
		// now: a hurried drain gives it that moment, so that a task that
		// honours cancellation is not reported as left running.
		if grace == nil {
			tm := time.NewTimer(hurriedGrace)
			defer tm.Stop()
			grace = tm.C
		}
		select {
		case <-t.done:
		case <-grace:
			running = append(running, t.name)
		}
	}
	if len(running) == 0 {
		return nil
	}
	return fmt.Errorf("lifecycle: phase %q: background task(s) %s still running: %w",
		phase, strings.Join(running, ", "), context.Cause(ctx))
}

func (l *Lifecycle) stopPhase(ctx context.Context, r *phaseRun) (err error) {
	timeout := r.StopTimeout
	if timeout == 0 {
		timeout = l.opts.stopTimeout
	}
	ctx, span := l.tracer.Start(ctx, "stop "+r.Name, trace.WithAttributes(attrPhase.String(r.Name)))
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("stop timeout %s passed", timeout))
	defer func() {
		cancel()
		recordOutcome(span, err)
		span.End()
	}()
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("phase %q: stop: %w", r.Name, recovered(v))
		}
	}()
	if err := r.Stop(ctx); err != nil {
		if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() && errors.Is(err, ctx.Err()) {
			// "context canceled" alone does not say by what.
			return fmt.Errorf("phase %q: stop: %w (%v)", r.Name, err, cause)
		}
		return fmt.Errorf("phase %q: stop: %w", r.Name, err)
	}
	return nil
}

// transitionLocked fires a lifecycle event. The events are fired only where
// the current state allows them, so a refusal is a bug in this package.
func (l *Lifecycle) transitionLocked(event string) {
	from := State(l.fsm.Current())
	if err := l.fsm.Event(context.Background(), event); err != nil {
		panic(fmt.Sprintf("lifecycle: event %q refused in state %q: %v", event, from, err))
	}
	to := State(l.fsm.Current())
	l.since = time.Now()
	l.history = append(l.history, Transition{State: to, At: l.since})
	e := Event{Time: l.since, Kind: EventLifecycle, From: from, To: to}
	if to == StateFailed && l.err != nil {
		e.Err = l.err.Error()
	}
	l.recordLocked(e)
	if to == StateFailed || to == StateStopped {
		l.closeDoneLocked()
	}
	l.publishLocked()
}

// phaseEventLocked fires a phase event at time at; err, when not nil, is
// the failure the event records. See transitionLocked.
func (l *Lifecycle) phaseEventLocked(r *phaseRun, event string, at time.Time, err error) {
	from := PhaseState(r.fsm.Current())
	if err := r.fsm.Event(context.Background(), event); err != nil {
		panic(fmt.Sprintf("lifecycle: phase %q: event %q refused in state %q: %v", r.Name, event, from, err))
	}
	to := PhaseState(r.fsm.Current())
	e := Event{
		Time:      at,
		Kind:      EventPhase,
		Name:      r.Name,
		From:      from,
		To:        to,
		Attempt:   r.attempts,
		DependsOn: r.DependsOn,
	}
	if err != nil {
		e.Err = err.Error()
	}
	l.recordLocked(e)
	l.publishLocked()
}
