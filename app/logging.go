package app

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/phasegate/phasegate/internal/eta"
	"github.com/phasegate/phasegate/lifecycle"
)

// EventLogger logs a lifecycle's events, one line each, for
// lifecycle.WithEventHook: every lifecycle transition, every phase's and
// background task's start and end (with how long it ran and how far it
// got, read from the lifecycle when lc is set), retries with their error,
// warnings set and cleared. The hook sees every event exactly once and in
// order, so the log does too, however far behind it runs.
//
// The lifecycle must exist before its hook can ask it anything, so the
// returned setter gives the logger its lifecycle once lifecycle.New has
// returned; until then (and with none) lines carry no duration or progress.
//
// Levels follow what happened: a phase that failed, a failed background
// task and a lifecycle that failed are ERROR; a phase cancelled by an
// orderly drain during the start is INFO, with the drain as its reason,
// not an error (a phase cancelled by another's failure stays ERROR, as
// part of that failure).
func EventLogger(log *slog.Logger) (hook func(lifecycle.Event), setLifecycle func(*lifecycle.Lifecycle)) {
	var mu sync.Mutex
	var lc *lifecycle.Lifecycle
	// The lifecycle's state as of the event being logged: the hook sees
	// events in order, so a phase cancelled after the lifecycle turned
	// draining was cancelled by the drain, whatever the lifecycle's state
	// is by the time the hook catches up.
	var state lifecycle.State
	return func(e lifecycle.Event) {
			mu.Lock()
			l := lc
			if to, ok := e.To.(lifecycle.State); ok {
				state = to
			}
			st := state
			mu.Unlock()
			logEvent(log, l, st, e)
		}, func(l *lifecycle.Lifecycle) {
			mu.Lock()
			lc = l
			mu.Unlock()
		}
}

// logEvent logs e; state is the lifecycle's state as of e.
func logEvent(log *slog.Logger, lc *lifecycle.Lifecycle, state lifecycle.State, e lifecycle.Event) {
	switch e.Kind {
	case lifecycle.EventLifecycle:
		logLifecycleEvent(log, lc, e)
	case lifecycle.EventPhase:
		logPhaseEvent(log, lc, state, e)
	case lifecycle.EventTask:
		logTaskEvent(log, lc, e)
	case lifecycle.EventWarningSet:
		log.Warn("warning", "name", e.Name, "message", e.Message)
	case lifecycle.EventWarningCleared:
		log.Info("warning cleared", "name", e.Name)
	}
}

// logLifecycleEvent logs the lifecycle moving between states, with how
// long the start took when it turns serving.
func logLifecycleEvent(log *slog.Logger, lc *lifecycle.Lifecycle, e lifecycle.Event) {
	attrs := []any{"state", e.To, "from", e.From}
	if e.To == lifecycle.StateServing && lc != nil {
		if s := lc.Snapshot(); !s.Started.IsZero() {
			attrs = append(attrs, "startup", e.Time.Sub(s.Started).Round(time.Millisecond).String())
		}
	}
	if e.Err != "" {
		var why error
		if lc != nil {
			why = lc.Snapshot().Err
		}
		if name := failedPhase(why); name != "" {
			attrs = append(attrs, "phase", name) // its "phase ended" line has the error
		} else {
			attrs = append(attrs, "error", e.Err)
		}
		log.Error("lifecycle", attrs...)
		return
	}
	log.Info("lifecycle", attrs...)
}

// failedOther returns a phase of snap other than name that failed, or "".
func failedOther(snap lifecycle.Snapshot, name string) string {
	for _, p := range snap.Phases {
		if p.State == lifecycle.PhaseFailed && p.Name != name {
			return p.Name
		}
	}
	return ""
}

// failedPhase returns the phase whose failure err is (a
// *lifecycle.PhaseError in its chain), or "". A phase's failure is logged
// once, with the phase's end: every later line about it (the lifecycle
// failed, a phase cancelled by it, the start failed, the exit) names the
// phase instead of repeating the error.
func failedPhase(err error) string {
	var pe *lifecycle.PhaseError
	if errors.As(err, &pe) {
		return pe.Phase
	}
	return ""
}

// logPhaseEvent logs a phase's first start, its retries and its end.
func logPhaseEvent(log *slog.Logger, lc *lifecycle.Lifecycle, state lifecycle.State, e lifecycle.Event) {
	switch e.To {
	case lifecycle.PhaseRunning:
		if e.Attempt <= 1 {
			log.Info("phase started", "phase", e.Name)
		}
	case lifecycle.PhaseRetrying:
		log.Warn("phase retrying", "phase", e.Name, "attempt", e.Attempt, "last_error", e.Err)
	default:
		logPhaseEnded(log, lc, state, e)
	}
}

// logPhaseEnded logs a phase's end with how long it ran and how far it
// got: at INFO when it succeeded, was skipped or was cancelled by an
// orderly drain (the drain is then its reason, not an error), else at
// ERROR with the panic's stack if one ended it.
func logPhaseEnded(log *slog.Logger, lc *lifecycle.Lifecycle, state lifecycle.State, e lifecycle.Event) {
	attrs := []any{"phase", e.Name, "state", e.To}
	var err error
	var snap lifecycle.Snapshot
	if lc != nil {
		snap = lc.Snapshot()
		if p, ok := snap.Phase(e.Name); ok {
			attrs = append(attrs, "duration", p.Duration().Round(time.Microsecond).String())
			if prog := p.Progress.String(); prog != "" {
				attrs = append(attrs, "progress", prog)
			}
			err = p.Err
		}
	}
	drained := e.To == lifecycle.PhaseCancelled && state == lifecycle.StateDraining
	if other := failedOther(snap, e.Name); e.To == lifecycle.PhaseCancelled && !drained && other != "" {
		// Cut short by another phase's failure, which that phase's line
		// says: not a fault of this one (its retries logged its errors).
		log.Info("phase ended", append(attrs, "reason", "phase "+other+" failed")...)
		return
	}
	if e.Err != "" {
		key := "error"
		if drained {
			key = "reason" // the drain, not a fault of the phase
		}
		attrs = append(attrs, key, e.Err)
	}
	if stack := PanicStack(err); stack != "" {
		attrs = append(attrs, "stack", stack)
	}
	switch e.To {
	case lifecycle.PhaseSucceeded, lifecycle.PhaseSkipped:
		log.Info("phase ended", attrs...)
	case lifecycle.PhaseCancelled:
		if drained {
			log.Info("phase ended", attrs...)
			return
		}
		log.Error("phase ended", attrs...)
	default:
		log.Error("phase ended", attrs...)
	}
}

// logTaskEvent logs a background task's start and its end, with how long
// it ran and how far it got; a failure at ERROR with the panic's stack if
// one ended it.
func logTaskEvent(log *slog.Logger, lc *lifecycle.Lifecycle, e lifecycle.Event) {
	if e.To == lifecycle.TaskRunning {
		log.Info("background task started", "task", e.Name, "phase", e.Phase)
		return
	}
	attrs := []any{"task", e.Name, "state", e.To}
	var err error
	if lc != nil {
		for _, t := range lc.Snapshot().Tasks {
			if t.Name == e.Name {
				attrs = append(attrs, "duration", t.Duration().Round(time.Millisecond).String())
				if prog := t.Progress.String(); prog != "" {
					attrs = append(attrs, "progress", prog)
				}
				err = t.Err
			}
		}
	}
	if e.To == lifecycle.TaskFailed {
		attrs = append(attrs, "error", e.Err)
		if stack := PanicStack(err); stack != "" {
			attrs = append(attrs, "stack", stack)
		}
		log.Error("background task ended", attrs...)
		return
	}
	log.Info("background task ended", attrs...)
}

// PanicStack returns the stack of a panic that err records (a
// *lifecycle.PanicError anywhere in its chain), or "".
func PanicStack(err error) string {
	var p *lifecycle.PanicError
	if errors.As(err, &p) {
		return string(p.Stack)
	}
	return ""
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// WarnSlowPhases logs a warning when a phase has run longer than its
// expected duration in expected, with its progress, rate and estimated time
// left, and again each time that duration passes once more, until the
// phase ends or stop is called. It samples the lifecycle every 250ms (a
// slow phase is one that publishes nothing for a long time) and returns
// once the start is over.
func WarnSlowPhases(lc *lifecycle.Lifecycle, log *slog.Logger, expected map[string]time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		type key struct {
			phase   string
			attempt int
		}
		warned := map[key]int{}
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			s := lc.Snapshot()
			switch s.State {
			case lifecycle.StateCreated, lifecycle.StateStarting:
			default:
				return
			}
			for _, p := range s.Phases {
				want := expected[p.Name]
				if want <= 0 || (p.State != lifecycle.PhaseRunning && p.State != lifecycle.PhaseRetrying) {
					continue
				}
				k := key{p.Name, p.Attempts}
				took := p.Duration()
				if took <= want*time.Duration(warned[k]+1) {
					continue
				}
				warned[k]++
				attrs := []any{"phase", p.Name, "running", took.Round(time.Second).String(), "expected", want.String(), "attempt", p.Attempts}
				if prog := p.Progress.String(); prog != "" {
					attrs = append(attrs, "progress", prog)
				}
				if e := etaOrAverage(p); e.Rate > 0 {
					attrs = append(attrs, "rate", eta.FormatRate(e.Rate))
					if e.OK {
						attrs = append(attrs, "eta", eta.FormatRemaining(e.Remaining))
					}
				}
				log.Warn("phase slower than expected", attrs...)
			}
		}
	})
	return func() {
		select {
		case <-done:
		default:
			close(done)
		}
		wg.Wait()
	}
}

// etaOrAverage is the phase's ETA or, while the estimator states no rate
// yet (its samples span too little time), the average since the phase
// started, with the time left at that rate: a slow phase's warning has a
// rate to give even when it is logged before the estimator has one.
func etaOrAverage(p lifecycle.PhaseSnapshot) lifecycle.Estimate {
	if p.ETA.Rate > 0 {
		return p.ETA
	}
	rate := eta.Average(p.Progress.Done, p.Duration())
	if rate <= 0 {
		return p.ETA
	}
	left, ok := eta.Remaining(rate, p.Progress.Done, p.Progress.Total)
	return lifecycle.Estimate{Rate: rate, Remaining: left, OK: ok}
}
