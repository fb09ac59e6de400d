package history

import (
	"fmt"
	"slices"
	"strconv"
	"time"
)

// minStarts is how many earlier starts a step needs before Usual speaks
// of it: one or two are an anecdote, not a habit.
const minStarts = 3

// Usual is what a step usually takes, over the starts kept in which it
// succeeded.
type Usual struct {
	// Starts is how many starts the figures are from.
	Starts int
	// Median, Low and High are the median, least and most it took.
	Median, Low, High time.Duration
	// Total is the median of its progress totals, 0 when it reported
	// none; Unit their unit.
	Total int64
	Unit  string
}

// Usual is what the step name (a task when task is set) usually takes, over
// the starts Open read in which it succeeded: those before this process's
// own, which it is compared with. ok is false when fewer than 3 starts
// have it: there is no usual yet. The figures were computed once, by Open:
// this is a map lookup, cheap enough for every /health answer.
func (l *Log) Usual(name string, task bool) (u Usual, ok bool) {
	u, ok = l.usual[stepKey{name, task}]
	return u, ok
}

// stepKey names a step: phases and tasks may share a name.
type stepKey struct {
	name string
	task bool
}

// usualOf is each step's Usual over starts, for the steps that succeeded
// in at least minStarts of them.
func usualOf(starts []Start) map[stepKey]Usual {
	type samples struct {
		took   []time.Duration
		totals []int64
		unit   string
	}
	by := map[stepKey]*samples{}
	for _, s := range starts {
		for _, st := range s.Steps {
			if st.Outcome != "succeeded" {
				continue
			}
			k := stepKey{st.Name, st.Task}
			x := by[k]
			if x == nil {
				x = &samples{}
				by[k] = x
			}
			x.took = append(x.took, st.Took)
			x.totals = append(x.totals, st.Total)
			if st.Unit != "" {
				x.unit = st.Unit
			}
		}
	}
	out := make(map[stepKey]Usual, len(by))
	for k, x := range by {
		if len(x.took) < minStarts {
			continue
		}
		slices.Sort(x.took)
		slices.Sort(x.totals)
		out[k] = Usual{Starts: len(x.took), Median: x.took[len(x.took)/2], Low: x.took[0], High: x.took[len(x.took)-1],
			Total: x.totals[len(x.totals)/2], Unit: x.unit}
	}
	return out
}

// slowFactor and slowMargin say what "much slower than usual" is: at least
// three times the median and at least half a second more, so that a step
// of milliseconds is not flagged for a few more.
const (
	slowFactor = 3
	slowMargin = 500 * time.Millisecond
)

// Slow reports whether a step that took took is much slower than usual:
// at least 3 times its median and at least 500ms more.
func (u Usual) Slow(took time.Duration) bool {
	return u.Starts > 0 && took >= slowFactor*u.Median && took-u.Median >= slowMargin
}

// String reads "usually 310ms (280ms–350ms) over the last 20 starts, ~10
// namespaces".
func (u Usual) String() string {
	s := fmt.Sprintf("usually %s (%s–%s) over the last %d starts", round(u.Median), round(u.Low), round(u.High), u.Starts)
	if u.Total > 0 {
		s += ", ~" + strconv.FormatInt(u.Total, 10)
		if u.Unit != "" {
			s += " " + u.Unit
		}
	}
	return s
}

// round rounds d for a reader: to the millisecond under a second, to the
// 10ms under a minute, to the second beyond.
func round(d time.Duration) time.Duration {
	switch {
	case d < time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d < time.Second:
		return d.Round(time.Millisecond)
	case d < time.Minute:
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Second)
}
