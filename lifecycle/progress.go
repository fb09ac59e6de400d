package lifecycle

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// Progress is a phase's handle on the runner: it reports how far along the
// phase is and hands work to the background. Its counters are atomic, so
// calling Add once per item is cheap; observers see the changes at most once
// per [WithProgressInterval] and always at the next state change.
//
// A Progress is valid only during the Run call it was given to, except that
// a deferred task's own Progress lives as long as the task.
type Progress struct {
	done  atomic.Int64
	total atomic.Int64

	mu      sync.Mutex
	unit    string
	message string

	lc    *Lifecycle // notified of every change; never nil
	phase *phaseRun  // the phase that owns this Progress; nil for tasks
}

// ProgressSnapshot is a copy of a [Progress] at one moment.
type ProgressSnapshot struct {
	Done    int64  `json:"done"`
	Total   int64  `json:"total"`
	Unit    string `json:"unit,omitempty"`
	Message string `json:"message,omitempty"`
}

// String renders the progress the way health endpoints show it:
// "1200/5000 namespaces", "1200 namespaces" without a total, or the message
// alone when nothing was counted.
func (s ProgressSnapshot) String() string {
	var out string
	switch {
	case s.Total > 0:
		out = fmt.Sprintf("%d/%d", s.Done, s.Total)
	case s.Done > 0:
		out = fmt.Sprintf("%d", s.Done)
	}
	if out != "" && s.Unit != "" {
		out += " " + s.Unit
	}
	if s.Message != "" {
		if out == "" {
			return s.Message
		}
		out += ": " + s.Message
	}
	return out
}

// IsZero reports whether nothing was reported.
func (s ProgressSnapshot) IsZero() bool { return s == ProgressSnapshot{} }

// SetTotal sets how many units of work there are, and their unit
// ("namespaces", "slots"). A total of 0 means unknown.
func (p *Progress) SetTotal(total int64, unit string) {
	p.total.Store(total)
	p.mu.Lock()
	p.unit = unit
	p.mu.Unlock()
	p.lc.progressChanged()
}

// Add records n more units done.
func (p *Progress) Add(n int64) {
	p.done.Add(n)
	p.lc.progressChanged()
}

// SetDone records that done units are done.
func (p *Progress) SetDone(done int64) {
	p.done.Store(done)
	p.lc.progressChanged()
}

// SetMessage sets a short human-readable note ("waiting for 12 host links").
func (p *Progress) SetMessage(msg string) {
	p.mu.Lock()
	p.message = msg
	p.mu.Unlock()
	p.lc.progressChanged()
}

// Defer hands fn to the background. The phase does not wait for it: once Run
// returns nil the phase succeeds and its dependents go on while fn runs. The
// task is visible in snapshots under name with its own progress and outcome,
// is traced as a span linked to this phase, and its ctx is cancelled when the
// lifecycle drains or fails. A task that fails marks the lifecycle degraded,
// not failed.
//
// Tasks start when the phase succeeds; those deferred by an attempt that then
// fails are dropped, never run. Defer on the Progress of a background task
// panics: a task cannot defer further work.
func (p *Progress) Defer(name string, fn func(ctx context.Context, p *Progress) error) {
	if p.phase == nil {
		panic("lifecycle: Defer called on a background task's Progress")
	}
	p.lc.mu.Lock()
	p.phase.deferred = append(p.phase.deferred, deferredTask{name, fn})
	p.lc.mu.Unlock()
}

// snapshot returns the current values.
func (p *Progress) snapshot() ProgressSnapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	return ProgressSnapshot{
		Done:    p.done.Load(),
		Total:   p.total.Load(),
		Unit:    p.unit,
		Message: p.message,
	}
}

func (p *Progress) reset() {
	p.done.Store(0)
	p.total.Store(0)
	p.mu.Lock()
	p.unit, p.message = "", ""
	p.mu.Unlock()
}
