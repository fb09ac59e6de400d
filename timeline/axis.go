package timeline

import (
	"fmt"
	"strconv"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// tick is one labelled mark of the time axis.
type tick struct {
	X     float64
	Label string
}

// axis maps times onto the chart's x coordinates.
type axis struct {
	t0, end     time.Time
	span        time.Duration // end - t0, at least a millisecond
	left, right float64       // the chart's edges
	running     bool          // a phase or task has not ended
	starting    bool          // the lifecycle is created or starting
}

// newAxis spans the chart from the start to now while anything runs, or
// to the last end once everything is over.
func newAxis(s lifecycle.Snapshot, now time.Time) axis {
	a := axis{t0: s.Started, left: float64(labelWidth), right: float64(chartWidth - rightPad)}
	a.end = a.t0
	consider := func(started, ended time.Time) {
		if started.IsZero() {
			return
		}
		if a.t0.IsZero() || started.Before(a.t0) {
			a.t0 = started
		}
		if ended.IsZero() {
			a.running = true
		} else if ended.After(a.end) {
			a.end = ended
		}
	}
	for _, ph := range s.Phases {
		consider(ph.Started, ph.Ended)
	}
	for _, t := range s.Tasks {
		consider(t.Started, t.Ended)
	}
	// While starting, the axis runs to now; after, to the last end, and
	// what still runs (a background loop) reaches the right edge.
	a.starting = s.State == lifecycle.StateStarting || s.State == lifecycle.StateCreated
	if a.starting || !a.end.After(a.t0) {
		a.end = now
	}
	if a.t0.IsZero() {
		a.t0, a.end = now, now
	}
	a.span = max(a.end.Sub(a.t0), time.Millisecond)
	return a
}

// xOf is t's x coordinate.
func (a axis) xOf(t time.Time) float64 {
	return a.left + (a.right-a.left)*float64(t.Sub(a.t0))/float64(a.span)
}

// clip is t, or the axis's end if t is past it.
func (a axis) clip(t time.Time) time.Time {
	if t.After(a.end) {
		return a.end
	}
	return t
}

// ticks chooses a 1-2-5 step giving about eight ticks over span.
func ticks(span time.Duration, left, right float64) []tick {
	step := time.Duration(1)
	for mag := time.Microsecond; ; mag *= 10 {
		found := false
		for _, m := range []time.Duration{1, 2, 5} {
			if span/(m*mag) <= 8 {
				step, found = m*mag, true
				break
			}
		}
		if found {
			break
		}
	}
	var out []tick
	for t := time.Duration(0); t <= span; t += step {
		out = append(out, tick{X: left + (right-left)*float64(t)/float64(span), Label: fmtTick(t)})
	}
	return out
}

func fmtTick(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Millisecond:
		return strconv.FormatInt(d.Microseconds(), 10) + "µs"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
	}
	return d.String()
}

// fmtDuration keeps durations short: "412µs", "38ms", "2.13s", "3m05s".
func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	case d < time.Minute:
		return d.Round(10 * time.Millisecond).String()
	}
	d = d.Round(time.Second)
	return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
}
