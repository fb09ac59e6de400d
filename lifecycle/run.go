package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// phaseResult is what a phase goroutine reports to the scheduler.
type phaseResult struct {
	index      int
	err        error // nil on success
	cancelled  bool  // the phase was stopped from outside, not failed
	notStarted bool  // the start was halted before the phase could begin
}

// run schedules the phases and carries a start through to serving or failed.
func (l *Lifecycle) run(ctx context.Context) error {
	began := time.Now()
	ctx, span := l.tracer.Start(ctx, "startup")
	if span.IsRecording() {
		span.SetAttributes(attrPhaseCount.Int(len(l.phases)))
	}
	defer func() {
		if f := l.opts.spanAttributes; f != nil && span.IsRecording() {
			span.SetAttributes(f(SpanEnd{Took: time.Since(began)})...)
		}
		span.End()
	}()
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	succeeded, failure := l.schedule(runCtx, cancel)
	if failure == nil && succeeded < len(l.phases) {
		// The schedule ended early: ctx ended before every phase could run.
		// A ctx that ends after the last phase succeeded ended nothing.
		failure = startEnded(ctx)
	}
	return l.settle(ctx, span, failure)
}

// schedule runs each phase once its dependencies succeeded, up to
// maxParallel at a time, until every phase ran, one failed (cancel then
// gives its error to the others' ctx as the cause) or ctx ended. It
// returns how many phases succeeded and the first failure.
func (l *Lifecycle) schedule(ctx context.Context, cancel context.CancelCauseFunc) (succeeded int, failure error) {
	waiting := make([]int, len(l.phases))
	var ready []int // declaration order: indices only ever grow within it
	for i, r := range l.phases {
		waiting[i] = len(r.deps)
		if waiting[i] == 0 {
			ready = append(ready, i)
		}
	}
	results := make(chan phaseResult, len(l.phases))
	running := 0
	for {
		for failure == nil && ctx.Err() == nil && len(ready) > 0 &&
			(l.opts.maxParallel <= 0 || running < l.opts.maxParallel) {
			i := ready[0]
			ready = ready[1:]
			running++
			if running == 1 && len(ready) == 0 {
				// The only phase that can run now: nothing else can finish
				// while it runs, so running it on this goroutine delays no
				// one and saves a goroutine and a wake-up per phase.
				l.runPhase(ctx, l.phases[i], results)
				break
			}
			go l.runPhase(ctx, l.phases[i], results)
		}
		if running == 0 {
			return succeeded, failure
		}
		res := <-results
		running--
		if res.cancelled || res.notStarted {
			continue // the cause is a failure already recorded, or ctx
		}
		if res.err != nil {
			if failure == nil {
				failure = res.err
				cancel(res.err) // siblings see the failure as their ctx's cause
			}
			continue
		}
		succeeded++
		for _, d := range l.phases[res.index].dependents {
			if waiting[d]--; waiting[d] == 0 {
				ready = insertSorted(ready, d)
			}
		}
	}
}

// startEnded is the failure of a start whose ctx ended before every phase
// ran: the start timeout, or the caller's cancellation.
func startEnded(ctx context.Context) error {
	var timeout *StartTimeoutError
	cause := context.Cause(ctx)
	if errors.As(cause, &timeout) {
		return timeout
	}
	return fmt.Errorf("lifecycle: start cancelled: %w", cause)
}

// settle takes the lifecycle where the start's outcome leads: serving;
// draining, when a drain cut the start short (the drain runs the stops of
// the phases that succeeded); or failed, after rolling the start back.
// Phases that never ran are skipped.
func (l *Lifecycle) settle(ctx context.Context, span trace.Span, failure error) error {
	l.mu.Lock()
	draining := State(l.fsm.Current()) == StateDraining
	if failure == nil && !draining {
		l.transitionLocked(evServe)
		l.mu.Unlock()
		span.SetAttributes(attrOutcome.String(string(StateServing)))
		return nil
	}
	now := time.Now()
	for _, r := range l.phases {
		if PhaseState(r.fsm.Current()) == PhasePending {
			l.phaseEventLocked(r, evSkip, now, nil)
		}
	}
	if draining {
		l.mu.Unlock()
		span.SetAttributes(attrOutcome.String(string(StateDraining)))
		if failure == nil || errors.Is(failure, ErrClosed) {
			return errDrainDuringStart
		}
		return errors.Join(errDrainDuringStart, failure) // a phase had failed first
	}
	l.err = failure
	l.transitionLocked(evFail)
	l.cancelTasks()
	l.mu.Unlock()
	return l.rollback(ctx, span, failure)
}

// rollback stops the phases that completed, after failure, and returns
// failure with the rollback's own error if it had one. The start's ctx is
// over, or about to be: the rollback runs under a ctx that keeps its
// values but not its cancellation; each stop has its own timeout.
func (l *Lifecycle) rollback(ctx context.Context, span trace.Span, failure error) error {
	rbCtx, rbSpan := l.tracer.Start(context.WithoutCancel(ctx), "rollback")
	rbErr := l.stopCompleted(rbCtx)
	recordOutcome(rbSpan, rbErr)
	rbSpan.End()

	span.SetAttributes(attrOutcome.String(string(StateFailed)))
	span.RecordError(failure)
	span.SetStatus(codes.Error, failure.Error())
	if rbErr != nil {
		return errors.Join(failure, fmt.Errorf("lifecycle: rollback: %w", rbErr))
	}
	return failure
}

// insertSorted inserts i into the ascending slice s.
func insertSorted(s []int, i int) []int {
	at := len(s)
	for at > 0 && s[at-1] > i {
		at--
	}
	s = append(s, 0)
	copy(s[at+1:], s[at:])
	s[at] = i
	return s
}

// runPhase runs one phase's attempts and reports the outcome.
//
// A phase whose goroutine was launched before the start was halted (a
// phase failed, the start timed out, a drain began, ctx ended) but had not
// begun yet does not begin: it stays pending, settle skips it, and it has
// no span. The check and its first attempt's event happen under one lock,
// the one under which a failure is recorded, so that in the event log no
// phase starts after a failure.
func (l *Lifecycle) runPhase(ctx context.Context, r *phaseRun, results chan<- phaseResult) {
	l.mu.Lock()
	if l.startHalted || ctx.Err() != nil {
		l.mu.Unlock()
		results <- phaseResult{index: r.index, notStarted: true}
		return
	}
	l.beginAttemptLocked(r, 1)
	l.mu.Unlock()

	ctx, span := l.tracer.Start(ctx, "phase "+r.Name)
	if span.IsRecording() { // spares the attributes' allocations when tracing is off
		span.SetAttributes(attrPhase.String(r.Name), attrDependsOn.StringSlice(r.DependsOn))
	}
	l.mu.Lock()
	r.spanCtx = span.SpanContext()
	l.mu.Unlock()

	err := l.attempts(ctx, r, span)

	l.mu.Lock()
	r.ended = time.Now()
	outcome := PhaseSucceeded
	switch {
	case err == nil:
		l.phaseEventLocked(r, evOK, r.ended, nil)
		l.completed = append(l.completed, r.index)
		for _, t := range r.deferred {
			l.startTaskLocked(r, t)
		}
	case ctx.Err() != nil:
		// Cancelled from outside: a sibling failed or the start was
		// cancelled. The cause, not this phase, explains the failure.
		outcome = PhaseCancelled
		l.phaseEventLocked(r, evCancel, r.ended, err)
	default:
		outcome = PhaseFailed
		l.startHalted = true // nothing starts after this event
		l.phaseEventLocked(r, evFail, r.ended, err)
	}
	r.deferred = nil
	attempts := r.attempts
	prog := r.progress.snapshot()
	took := r.ended.Sub(r.attempt)
	ran := r.ended.Sub(r.started) // every attempt and backoff
	l.mu.Unlock()

	if span.IsRecording() {
		span.SetAttributes(
			attrAttempts.Int(attempts),
			attrProgressDone.Int64(prog.Done),
			attrProgressTotal.Int64(prog.Total),
			attrOutcome.String(string(outcome)),
		)
		if f := l.opts.spanAttributes; f != nil {
			span.SetAttributes(f(SpanEnd{Name: r.Name, Took: ran})...)
		}
		span.SetAttributes(rateAttributes(prog, took)...)
	}
	if outcome != PhaseSucceeded {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()

	switch outcome {
	case PhaseFailed:
		err = &PhaseError{Phase: r.Name, Attempts: attempts, Err: err}
	case PhaseCancelled:
		err = fmt.Errorf("phase %q cancelled: %w", r.Name, err)
	}
	results <- phaseResult{index: r.index, err: err, cancelled: outcome == PhaseCancelled}
}

// beginAttemptLocked records the start of attempt n of r.
func (l *Lifecycle) beginAttemptLocked(r *phaseRun, n int) {
	r.attempts = n
	r.deferred = nil
	r.attempt = time.Now()
	if n == 1 {
		r.started = r.attempt
	}
	r.progress.reset()
	l.phaseEventLocked(r, evRun, r.attempt, nil)
}

// attempts calls Run until it succeeds, fails permanently, runs out of
// attempts or ctx ends; runPhase began the first attempt. It leaves the
// phase running or retrying; the caller fires the final event.
func (l *Lifecycle) attempts(ctx context.Context, r *phaseRun, span trace.Span) error {
	if err := r.resolvePolicy(); err != nil {
		return Permanent(err)
	}
	if r.PolicyFrom != nil {
		// The views show the bound the policy just given sets.
		d, _ := Phase{Timeout: r.Timeout, Retry: r.Retry}.WorstCase()
		l.mu.Lock()
		r.worstCase = d
		l.publishLocked()
		l.mu.Unlock()
	}
	max := r.Retry.attempts()
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			l.mu.Lock()
			l.beginAttemptLocked(r, attempt)
			l.mu.Unlock()
		}

		err := l.attempt(ctx, r, attempt)
		if err == nil {
			return nil
		}
		l.mu.Lock()
		r.err = err
		l.mu.Unlock()
		if ctx.Err() != nil {
			return ctxErr(ctx, err)
		}
		if isPermanent(err) || attempt >= max {
			return err
		}

		delay := r.Retry.delay(attempt)
		span.AddEvent("retry", trace.WithAttributes(
			attrAttempt.Int(attempt),
			attrError.String(err.Error()),
			attrBackoff.String(delay.String()),
		))
		l.mu.Lock()
		l.phaseEventLocked(r, evRetry, time.Now(), err)
		l.mu.Unlock()
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctxErr(ctx, err)
		}
	}
}

// ctxErr explains why ctx ended, keeping the phase's own last error.
func ctxErr(ctx context.Context, last error) error {
	cause := context.Cause(ctx)
	if errors.Is(last, cause) {
		return last
	}
	return fmt.Errorf("%w (last error: %v)", cause, last)
}

// attempt calls Run once under the phase's timeout, turning a panic into a
// *PanicError and an expired timeout into an *AttemptTimeoutError.
func (l *Lifecycle) attempt(ctx context.Context, r *phaseRun, n int) (err error) {
	actx := ctx
	if r.Timeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, r.Timeout)
		defer cancel()
	}
	defer func() {
		if v := recover(); v != nil {
			err = recovered(v)
		}
		if err != nil && r.Timeout > 0 && ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
			own := err
			if own == context.DeadlineExceeded || own == context.Cause(actx) {
				own = nil // the context's error alone: nothing of the phase's to keep
			}
			err = &AttemptTimeoutError{Phase: r.Name, Attempt: n, Timeout: r.Timeout, Err: own}
		}
	}()
	return r.Run(actx, &r.progress)
}

// resolvePolicy sets r's Timeout and Retry from its PolicyFrom, if any,
// checked as New checks the fields. Only r's own goroutine reads them, and
// only after this.
func (r *phaseRun) resolvePolicy() error {
	if r.PolicyFrom == nil {
		return nil
	}
	p, err := callPolicyFrom(r.PolicyFrom)
	if err == nil {
		if problems := p.problems(); len(problems) > 0 {
			err = errors.New(strings.Join(problems, ", "))
		}
	}
	if err != nil {
		return &PolicyError{Phase: r.Name, Err: err}
	}
	r.Timeout, r.Retry = p.Timeout, p.Retry
	return nil
}

// callPolicyFrom calls f, turning a panic into a *PanicError.
func callPolicyFrom(f func() (AttemptBounds, error)) (p AttemptBounds, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = recovered(v)
		}
	}()
	return f()
}
