package app

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/lifecycle/history"
	"github.com/phasegate/phasegate/metrics"
)

// historyLog is the App's start history: opened at New, or once the
// phase Config.HistoryAfter names has succeeded; nil until then, and
// without Config.History.
type historyLog struct {
	path, after string
	size        int
	log         *slog.Logger
	l           atomic.Pointer[history.Log]
	opening     sync.Mutex // held while the file is read, so that it is read once
}

// setupHistory opens the start history Config.History names, unless
// Config.HistoryAfter defers it to that phase's success. One that cannot
// be read is started anew, with a warning: a history never stops a start.
func (a *App) setupHistory(phases []lifecycle.Phase) error {
	h := &a.history
	h.path, h.after, h.size, h.log = a.cfg.History, a.cfg.HistoryAfter, a.cfg.HistorySize, a.log
	if h.after != "" && !slices.ContainsFunc(phases, func(p lifecycle.Phase) bool { return p.Name == h.after }) {
		return fmt.Errorf("HistoryAfter names %q, which is not a phase", h.after)
	}
	if h.path != "" && h.after == "" {
		h.open()
	}
	return nil
}

// open reads the history's file, once.
func (h *historyLog) open() *history.Log {
	h.opening.Lock()
	defer h.opening.Unlock()
	if l := h.l.Load(); l != nil {
		return l
	}
	began := time.Now()
	l, err := history.Open(h.path, h.size)
	if err != nil {
		h.log.Warn("start history", "error", err)
	}
	h.l.Store(l)
	h.log.Debug("start history read", "path", h.path, "starts", len(l.Starts()), "took", time.Since(began).String())
	return l
}

// openAfter is the history, opened once the phase HistoryAfter names has
// succeeded among phases; nil before, and for good when it did not.
func (h *historyLog) openAfter(phases []lifecycle.PhaseSnapshot) *history.Log {
	if l := h.l.Load(); l != nil || h.path == "" {
		return l
	}
	for _, p := range phases {
		if p.Name == h.after && p.State == lifecycle.PhaseSucceeded {
			return h.open()
		}
	}
	return nil
}

// usual is what the views ask of the history; nil without one.
func (h *historyLog) usual() func(string, bool) (history.Usual, bool) {
	if h.path == "" {
		return nil
	}
	return func(name string, task bool) (history.Usual, bool) {
		if l := h.l.Load(); l != nil {
			return l.Usual(name, task)
		}
		return history.Usual{}, false
	}
}

// Attributes of the start's spans from the start history: a phase's or
// a task's usual, and the start's steps much slower than usual.
var (
	attrUsualMedian  = attribute.Key("phasegate.usual.median_ms")
	attrUsualStarts  = attribute.Key("phasegate.usual.starts")
	attrUsual        = attribute.Key("phasegate.usual")
	attrSlow         = attribute.Key("phasegate.slower_than_usual")
	attrStartSlow    = attribute.Key("phasegate.start.slower_than_usual")
	attrStartCompare = attribute.Key("phasegate.start.steps_compared")
)

// spanAttributes is what a span of the start says of the history: a
// phase's or a task's usual once the history is open (nothing before, nor
// for a step without a usual yet); for the start's own span, which ends
// once the start is over, every step that ended much slower than usual,
// those that ended before the history could be read included.
func (a *App) spanAttributes(e lifecycle.SpanEnd) []attribute.KeyValue {
	h := &a.history
	if e.Name == "" {
		if h.path == "" {
			return nil
		}
		return h.startAttributes(a.lc.Snapshot())
	}
	l := h.l.Load()
	if l == nil {
		return nil
	}
	u, ok := l.Usual(e.Name, e.Task)
	if !ok {
		return nil
	}
	return []attribute.KeyValue{
		attrUsual.String(u.String()),
		attrUsualMedian.Float64(float64(u.Median.Microseconds()) / 1000),
		attrUsualStarts.Int(u.Starts),
		attrSlow.Bool(u.Slow(e.Took)),
	}
}

// startAttributes compares each step of s that ended with its usual.
func (h *historyLog) startAttributes(s lifecycle.Snapshot) []attribute.KeyValue {
	l := h.openAfter(s.Phases)
	if l == nil {
		return nil
	}
	compared, slow := 0, []string{}
	eachEnded(s, func(name string, task bool, took time.Duration, _ lifecycle.ProgressSnapshot) {
		u, ok := l.Usual(name, task)
		if !ok {
			return
		}
		compared++
		if u.Slow(took) {
			slow = append(slow, fmt.Sprintf("%s %s took %v, %s", stepKind(task), name, took.Round(time.Millisecond), u))
		}
	})
	return []attribute.KeyValue{attrStartCompare.Int(compared), attrStartSlow.StringSlice(slow)}
}

// eachEnded calls f for each phase, then each background task, of s that
// has ended, with how long it ran and its last progress.
func eachEnded(s lifecycle.Snapshot, f func(name string, task bool, took time.Duration, prog lifecycle.ProgressSnapshot)) {
	for _, p := range s.Phases {
		if !p.Ended.IsZero() {
			f(p.Name, false, p.Ended.Sub(p.Started), p.Progress)
		}
	}
	for _, t := range s.Tasks {
		if !t.Ended.IsZero() {
			f(t.Name, true, t.Ended.Sub(t.Started), t.Progress)
		}
	}
}

// stepKind names a phase or, with task, a background task.
func stepKind(task bool) string {
	if task {
		return "task"
	}
	return "phase"
}

// recordStart follows lc's start and keeps it in h: once the start is
// over (served, failed or drained), its phases, each compared with what it
// usually takes, the slow ones logged and counted; then each background
// task as it ends, the same way. The record is written when the start is
// over, again as each task ends, and a last time at stop. The goroutine
// it starts is stopped and waited for by the function it returns.
func recordStart(lc *lifecycle.Lifecycle, h *historyLog, slow *metrics.SlowSteps) (stop func()) {
	snaps, unsubscribe := lc.Subscribe()
	done := make(chan struct{})
	var wg sync.WaitGroup
	r := &recorder{h: h, slow: slow, judged: map[string]bool{}}
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case s := <-snaps:
				if !r.follow(s) {
					return
				}
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			wg.Wait()
			unsubscribe()
			r.final(lc.Snapshot())
		})
	}
}

// recorder is recordStart's state, owned by its goroutine until stop.
type recorder struct {
	h        *historyLog
	slow     *metrics.SlowSteps
	recorded bool            // the start is in the history
	judged   map[string]bool // steps compared with their usual, by kind and name
	warned   bool            // a write error was logged
}

// follow takes the latest snapshot: it records the start once over and
// each task as it ends. It returns false once there is nothing left to
// follow.
func (r *recorder) follow(s lifecycle.Snapshot) bool {
	l := r.h.openAfter(s.Phases)
	if !startOver(s) {
		return true
	}
	if l == nil {
		return false // the phase the history waits for never succeeded
	}
	now := time.Now()
	changed := !r.recorded
	eachEnded(s, func(name string, task bool, took time.Duration, prog lifecycle.ProgressSnapshot) {
		r.judge(l, name, task, took, prog, &changed)
	})
	running := slices.ContainsFunc(s.Tasks, func(t lifecycle.TaskSnapshot) bool { return t.Ended.IsZero() })
	if changed {
		r.write(l, history.StartOf(s, now))
	}
	return running || s.State == lifecycle.StateStarting
}

// final writes the start as it stands at stop: tasks still running are
// kept with how long they ran.
func (r *recorder) final(s lifecycle.Snapshot) {
	if l := r.h.l.Load(); l != nil && startOver(s) {
		r.write(l, history.StartOf(s, time.Now()))
	}
}

// judge compares a step that ended, once, with what it usually takes,
// logging and counting it when much slower; changed is set when it was
// not judged before.
func (r *recorder) judge(l *history.Log, name string, task bool, took time.Duration, prog lifecycle.ProgressSnapshot, changed *bool) {
	kind := stepKind(task)
	key := kind + "\x00" + name
	if r.judged[key] {
		return
	}
	r.judged[key], *changed = true, true
	u, ok := l.Usual(name, task)
	if !ok || !u.Slow(took) {
		return
	}
	attrs := []any{kind, name, "took", took.Round(time.Millisecond).String(), "usual", u.String()}
	if p := prog.String(); p != "" {
		attrs = append(attrs, "progress", p)
	}
	r.h.log.Warn(kind+" slower than usual", attrs...)
	r.slow.Add(name, task)
}

// write keeps s in the history, replacing the record of the same start.
func (r *recorder) write(l *history.Log, s history.Start) {
	var err error
	if r.recorded {
		err = l.Replace(s)
	} else {
		err = l.Add(s)
	}
	r.recorded = true
	if err != nil && !r.warned {
		r.warned = true
		r.h.log.Warn("start history not written", "error", err)
	}
}

// startOver reports whether s's start is over: it served, failed, or was
// drained.
func startOver(s lifecycle.Snapshot) bool {
	for _, t := range s.History {
		switch t.State {
		case lifecycle.StateServing, lifecycle.StateFailed, lifecycle.StateDraining:
			return true
		}
	}
	return false
}
