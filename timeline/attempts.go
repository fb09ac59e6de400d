package timeline

import (
	"fmt"
	"math"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// try is one failed attempt of a phase, drawn in the colour of failed
// attempts with its error in its title.
type try struct {
	X, W  float64
	Title string
}

// attempts is what the event log says of one phase's attempts: when each
// began, by number, and those that failed and were retried.
type attempts struct {
	began  map[int]time.Time
	failed []failedAttempt
}

// failedAttempt is an attempt that failed and was retried.
type failedAttempt struct {
	n      int
	ended  time.Time
	errMsg string
}

// attemptsOf reads each phase's attempts from the event log.
func attemptsOf(events []lifecycle.Event) map[string]attempts {
	out := map[string]attempts{}
	for _, e := range events {
		if e.Kind != lifecycle.EventPhase || e.Attempt == 0 {
			continue
		}
		a, ok := out[e.Name]
		if !ok {
			a.began = map[int]time.Time{}
		}
		switch e.To {
		case lifecycle.PhaseRunning:
			a.began[e.Attempt] = e.Time
		case lifecycle.PhaseRetrying:
			a.failed = append(a.failed, failedAttempt{n: e.Attempt, ended: e.Time, errMsg: e.Err})
		}
		out[e.Name] = a
	}
	return out
}

// drawTries draws the failed attempts of a phase now at attempt last
// before its bar, and narrows the bar to the last attempt. Without the
// event log (att empty) the bar stays whole.
func (b *bar) drawTries(att attempts, last int, ax axis) {
	for _, f := range att.failed {
		began, ok := att.began[f.n]
		if !ok {
			continue
		}
		x := ax.xOf(ax.clip(began))
		b.Tries = append(b.Tries, try{
			X: x, W: math.Max(2, ax.xOf(ax.clip(f.ended))-x),
			Title: fmt.Sprintf("%s: attempt %d failed after %s: %s", b.Label, f.n, fmtDuration(f.ended.Sub(began)), f.errMsg),
		})
	}
	if n := len(att.failed); n > 0 {
		lastErr := att.failed[n-1].errMsg
		b.Failed = fmt.Sprintf("%d failed, the last: %s", n, truncate(lastErr, 120))
	}
	if began, ok := att.began[last]; ok && b.W > 0 {
		end := b.X + b.W
		b.X = ax.xOf(ax.clip(began))
		b.W = math.Max(3, end-b.X)
		b.Done = math.Min(b.Done, b.W)
	}
}
