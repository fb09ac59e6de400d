package lifecycle

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

// Defaults of an [Estimator].
const (
	// DefaultETAWindow is how far back an Estimator looks for the rate.
	DefaultETAWindow = 5 * time.Second
	// DefaultETAMinSpan is how much time the samples must span before an
	// Estimator states a rate: a phase that reported a burst of progress a
	// moment ago has no rate yet.
	DefaultETAMinSpan = 300 * time.Millisecond
	// maxETASamples bounds the samples kept per phase or task, whatever
	// the observation rate.
	maxETASamples = 256
)

// Estimate is how fast a phase or background task makes progress and,
// while it runs, when it should be done.
type Estimate struct {
	// Rate is units of progress per second: over the recent window while
	// running, over the whole run once finished. Zero when unknown.
	Rate float64
	// Remaining is the estimated time to finish; valid only when OK.
	Remaining time.Duration
	// OK reports whether Remaining is known: the item runs, its total is
	// known and not reached, and its rate is positive.
	OK bool
}

// String renders the estimate the way health endpoints and the status view
// show it: "812/s, ~5s left", "812/s", or "" when nothing is known.
func (e Estimate) String() string {
	if e.Rate <= 0 {
		return ""
	}
	s := FormatRate(e.Rate)
	if e.OK {
		s += ", ~" + FormatRemaining(e.Remaining) + " left"
	}
	return s
}

// FormatRate renders units per second with two or three significant
// digits: "2400/s", "812/s", "3.5/s", "0.25/s".
func FormatRate(r float64) string {
	switch {
	case r >= 100:
		return strconv.FormatFloat(math.Round(r), 'f', -1, 64) + "/s"
	case r >= 10:
		return strconv.FormatFloat(math.Round(r*10)/10, 'f', -1, 64) + "/s"
	}
	return strconv.FormatFloat(math.Round(r*100)/100, 'f', -1, 64) + "/s"
}

// FormatRemaining renders a time left coarsely, as a person reads it:
// "0.4s", "12s", "3m05s", "1h02m".
func FormatRemaining(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
		fallthrough
	case d < 10*time.Second:
		return strconv.FormatFloat(math.Round(d.Seconds()*10)/10, 'f', -1, 64) + "s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Round(time.Second).Seconds()))
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	}
	d = d.Round(time.Minute)
	return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
}

// Estimates are an [Estimator]'s answers for one snapshot.
type Estimates struct {
	phases map[string]Estimate
	tasks  map[string]Estimate
}

// Phase returns the named phase's estimate; the zero Estimate when nothing
// is known.
func (e Estimates) Phase(name string) Estimate { return e.phases[name] }

// Task returns the named background task's estimate.
func (e Estimates) Task(name string) Estimate { return e.tasks[name] }

// Estimator turns successive snapshots into rates and times to finish. It
// keeps, per running phase and task, the progress it saw over a recent
// window and divides the progress made by the time it took; a retried
// phase starts afresh. It is fed by whoever observes the lifecycle (a
// health endpoint on each request, a notifier on each change), so its
// estimates are only as fresh as its observations. The zero value is not
// usable; create one with [NewEstimator]. It is safe for concurrent use.
type Estimator struct {
	window, minSpan time.Duration

	mu     sync.Mutex
	series map[string]*etaSeries
}

type etaSample struct {
	at   time.Time
	done int64
}

// etaSeries is one item's samples since it started its current attempt.
type etaSeries struct {
	attempt int
	started time.Time
	samples []etaSample // ascending in time
	seen    bool        // observed in the latest snapshot
}

// NewEstimator returns an estimator that computes rates over window
// ([DefaultETAWindow] when zero or less) and states none until its samples
// span at least minSpan ([DefaultETAMinSpan] when zero or less).
func NewEstimator(window, minSpan time.Duration) *Estimator {
	if window <= 0 {
		window = DefaultETAWindow
	}
	if minSpan <= 0 {
		minSpan = DefaultETAMinSpan
	}
	return &Estimator{window: window, minSpan: minSpan, series: make(map[string]*etaSeries)}
}

// Observe records s as seen at now and returns the estimates for every
// phase and task in it. Observations must come in time order; one older
// than the latest is used for its answer but not recorded.
func (e *Estimator) Observe(s Snapshot, now time.Time) Estimates {
	out := Estimates{phases: make(map[string]Estimate, len(s.Phases))}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ser := range e.series {
		ser.seen = false
	}
	for _, p := range s.Phases {
		running := p.State == PhaseRunning
		out.phases[p.Name] = e.observe("phase\x00"+p.Name, running, p.Attempts, p.Started, p.Duration(), p.Progress, now)
	}
	if len(s.Tasks) > 0 {
		out.tasks = make(map[string]Estimate, len(s.Tasks))
		for _, t := range s.Tasks {
			running := t.State == TaskRunning
			out.tasks[t.Name] = e.observe("task\x00"+t.Name, running, 1, t.Started, t.Duration(), t.Progress, now)
		}
	}
	for k, ser := range e.series {
		if !ser.seen {
			delete(e.series, k)
		}
	}
	return out
}

// Refresh returns the estimates for s, a later snapshot of the lifecycle
// that e was computed for, without observing s: a phase or task still
// running keeps e's rate and gets the time left from its current progress;
// one that has ended gets its average rate. It lets many readers share one
// Estimator: a single observer feeds it every published snapshot, and each
// reader refreshes the latest Estimates for the snapshot it answers from,
// taking no lock — a health endpoint checked thousands of times a second
// must not serialize its answers on the Estimator's mutex.
func (e Estimates) Refresh(s Snapshot) Estimates {
	out := Estimates{phases: make(map[string]Estimate, len(s.Phases))}
	for _, p := range s.Phases {
		if p.State != PhaseRunning {
			out.phases[p.Name] = finishedEstimate(p.Started, p.Duration(), p.Progress)
			continue
		}
		out.phases[p.Name] = withRemaining(e.phases[p.Name].Rate, p.Progress)
	}
	if len(s.Tasks) > 0 {
		out.tasks = make(map[string]Estimate, len(s.Tasks))
		for _, t := range s.Tasks {
			if t.State != TaskRunning {
				out.tasks[t.Name] = finishedEstimate(t.Started, t.Duration(), t.Progress)
				continue
			}
			out.tasks[t.Name] = withRemaining(e.tasks[t.Name].Rate, t.Progress)
		}
	}
	return out
}

// finishedEstimate is the average rate over an ended (or not started)
// item's whole run.
func finishedEstimate(started time.Time, took time.Duration, p ProgressSnapshot) Estimate {
	if p.Done > 0 && took > 0 && !started.IsZero() {
		return Estimate{Rate: float64(p.Done) / took.Seconds()}
	}
	return Estimate{}
}

// withRemaining is a running item's estimate at rate: the time left is
// known when the rate is positive and the total known and not reached.
func withRemaining(rate float64, p ProgressSnapshot) Estimate {
	est := Estimate{Rate: rate}
	if rate > 0 && p.Total > 0 && p.Done < p.Total {
		est.Remaining = time.Duration(float64(p.Total-p.Done) / rate * float64(time.Second))
		est.OK = true
	}
	return est
}

func (e *Estimator) observe(key string, running bool, attempt int, started time.Time, took time.Duration, p ProgressSnapshot, now time.Time) Estimate {
	if !running {
		// Finished (or not started): the average over the whole run.
		return finishedEstimate(started, took, p)
	}
	ser := e.series[key]
	if ser == nil || ser.attempt != attempt || !ser.started.Equal(started) {
		ser = &etaSeries{attempt: attempt, started: started}
		e.series[key] = ser
	}
	ser.seen = true
	e.record(ser, etaSample{now, p.Done})
	return e.estimate(ser, p, now)
}

// record appends a sample and forgets those that no longer matter: all but
// the last one before the window, so that the samples kept span at least
// the window once there is that much history.
func (e *Estimator) record(ser *etaSeries, smp etaSample) {
	n := len(ser.samples)
	switch {
	case n > 0 && smp.at.Before(ser.samples[n-1].at):
		return // out of order: not recorded
	case n > 0 && smp.at.Equal(ser.samples[n-1].at):
		ser.samples[n-1] = smp
	default:
		ser.samples = append(ser.samples, smp)
	}
	if smp.done < ser.samples[0].done {
		// Progress went back (a phase that reset its count): start over.
		ser.samples = append(ser.samples[:0], smp)
		return
	}
	cut := 0
	for cut+1 < len(ser.samples) && !ser.samples[cut+1].at.After(smp.at.Add(-e.window)) {
		cut++
	}
	if len(ser.samples)-cut > maxETASamples {
		cut = len(ser.samples) - maxETASamples
	}
	if cut > 0 {
		ser.samples = append(ser.samples[:0], ser.samples[cut:]...)
	}
}

func (e *Estimator) estimate(ser *etaSeries, p ProgressSnapshot, now time.Time) Estimate {
	first, last := ser.samples[0], ser.samples[len(ser.samples)-1]
	span := last.at.Sub(first.at)
	if span < e.minSpan || last.done <= first.done {
		return Estimate{}
	}
	return withRemaining(float64(last.done-first.done)/span.Seconds(), p)
}

// averageRate is done units over d, per second; zero when either is.
func averageRate(done int64, d time.Duration) float64 {
	if done <= 0 || d <= 0 {
		return 0
	}
	return float64(done) / d.Seconds()
}

// Span attribute keys for a phase's rate and estimated time left, set when
// its span ends: the rate of its last attempt, and, when it ended before
// its total was reached (failed or cancelled), how long the rest would
// have taken at that rate.
const (
	attrProgressRate = "phasegate.progress.rate"
	attrProgressETA  = "phasegate.progress.eta_s"
)

// rateAttributes are a finished attempt's rate and time left.
func rateAttributes(p ProgressSnapshot, took time.Duration) []attribute.KeyValue {
	rate := averageRate(p.Done, took)
	if rate <= 0 {
		return nil
	}
	attrs := []attribute.KeyValue{attribute.Float64(attrProgressRate, rate)}
	if p.Total > p.Done {
		attrs = append(attrs, attribute.Float64(attrProgressETA, float64(p.Total-p.Done)/rate))
	}
	return attrs
}
