package phases

import (
	"log/slog"
	"sync"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// LogTransitions logs every lifecycle transition and every phase's and
// background task's start and end (with duration and progress) until stop is
// called. It compares consecutive snapshots, so even when it falls behind it
// logs each start and end once, with the times the snapshot recorded.
func LogTransitions(lc *lifecycle.Lifecycle, log *slog.Logger) (stop func()) {
	ch, cancel := lc.Subscribe()
	var wg sync.WaitGroup
	wg.Go(func() {
		var prev lifecycle.Snapshot
		first := true
		for s := range ch {
			logDiff(log, prev, s, first)
			prev, first = s, false
		}
	})
	return func() { cancel(); wg.Wait() }
}

func logDiff(log *slog.Logger, prev, s lifecycle.Snapshot, first bool) {
	for i, p := range s.Phases {
		var old lifecycle.PhaseSnapshot
		if !first && i < len(prev.Phases) {
			old = prev.Phases[i]
		}
		if old.Started.IsZero() && !p.Started.IsZero() {
			log.Info("phase started", "phase", p.Name)
		}
		if p.Attempts > old.Attempts && p.Attempts > 1 {
			log.Warn("phase retrying", "phase", p.Name, "attempt", p.Attempts, "last_error", errString(p.Err))
		}
		if !old.State.Done() && p.State.Done() && p.State != old.State {
			attrs := []any{"phase", p.Name, "state", string(p.State), "duration", p.Duration().Round(time.Microsecond).String()}
			if prog := p.Progress.String(); prog != "" {
				attrs = append(attrs, "progress", prog)
			}
			if p.Err != nil && p.State != lifecycle.PhaseSucceeded {
				attrs = append(attrs, "error", p.Err.Error())
			}
			switch p.State {
			case lifecycle.PhaseSucceeded, lifecycle.PhaseSkipped:
				log.Info("phase ended", attrs...)
			default:
				log.Error("phase ended", attrs...)
			}
		}
	}
	for i, t := range s.Tasks {
		if i >= len(prev.Tasks) {
			log.Info("background task started", "task", t.Name, "phase", t.Phase)
		}
		if t.State != lifecycle.TaskRunning && (i >= len(prev.Tasks) || prev.Tasks[i].State == lifecycle.TaskRunning) {
			attrs := []any{"task", t.Name, "state", string(t.State), "duration", t.Duration().Round(time.Millisecond).String()}
			if prog := t.Progress.String(); prog != "" {
				attrs = append(attrs, "progress", prog)
			}
			if t.State == lifecycle.TaskFailed {
				log.Error("background task ended", append(attrs, "error", errString(t.Err))...)
			} else {
				log.Info("background task ended", attrs...)
			}
		}
	}
	if first || s.State != prev.State {
		attrs := []any{"state", string(s.State)}
		if !first {
			attrs = append(attrs, "from", string(prev.State))
		}
		if s.State == lifecycle.StateServing && !s.Started.IsZero() {
			attrs = append(attrs, "startup", s.Since.Sub(s.Started).Round(time.Millisecond).String())
		}
		if s.Err != nil && (s.State == lifecycle.StateFailed || s.State == lifecycle.StateStopped) {
			attrs = append(attrs, "error", s.Err.Error())
		}
		log.Info("lifecycle", attrs...)
	}
	if s.Degraded && !prev.Degraded {
		log.Warn("lifecycle degraded: a background task failed")
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
