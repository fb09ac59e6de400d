package app

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
	// Every transition is logged once, from the history, even those an
	// observer that fell behind never saw as a state of its own.
	from := lifecycle.StateCreated
	if n := len(prev.History); n > 0 && !first {
		from = prev.History[n-1].State
	}
	seen := len(prev.History)
	if first {
		seen = 0
		log.Info("lifecycle", "state", string(lifecycle.StateCreated))
	}
	for _, tr := range s.History[seen:] {
		attrs := []any{"state", string(tr.State), "from", string(from)}
		if tr.State == lifecycle.StateServing && !s.Started.IsZero() {
			attrs = append(attrs, "startup", tr.At.Sub(s.Started).Round(time.Millisecond).String())
		}
		if s.Err != nil && tr.State == lifecycle.StateFailed {
			attrs = append(attrs, "error", s.Err.Error())
		}
		log.Info("lifecycle", attrs...)
		from = tr.State
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
		est := lifecycle.NewEstimator(0, 0)
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
			ests := est.Observe(s, time.Now())
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
				e := ests.Phase(p.Name)
				if e.Rate <= 0 && p.Progress.Done > 0 && took > 0 {
					// Not sampled long enough yet: the average so far.
					e.Rate = float64(p.Progress.Done) / took.Seconds()
					if left := p.Progress.Total - p.Progress.Done; left > 0 {
						e.Remaining, e.OK = time.Duration(float64(left)/e.Rate*float64(time.Second)), true
					}
				}
				if e.Rate > 0 {
					attrs = append(attrs, "rate", lifecycle.FormatRate(e.Rate))
					if e.OK {
						attrs = append(attrs, "eta", lifecycle.FormatRemaining(e.Remaining))
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
