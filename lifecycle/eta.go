package lifecycle

import (
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/phasegate/phasegate/internal/eta"
)

// Parameters of the lifecycle's [estimator].
const (
	// etaWindow is how far back the estimator looks for the rate.
	etaWindow = 5 * time.Second
	// etaMinSpan is how much time the samples must span before the
	// estimator states a rate: a phase that reported a burst of progress a
	// moment ago has no rate yet.
	etaMinSpan = 300 * time.Millisecond
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
	s := eta.FormatRate(e.Rate)
	if e.OK {
		s += ", ~" + eta.FormatRemaining(e.Remaining) + " left"
	}
	return s
}

// estimator turns the lifecycle's successive snapshots into rates and
// times to finish. It keeps, per running phase and task, the progress it saw
// over a recent window and divides the progress made by the time it took; a
// retried phase starts afresh. The lifecycle owns one, guarded by its
// mutex, and feeds it every snapshot it takes, so that every reader of a
// snapshot (health endpoints, STATUS= lines, metrics, logs, the timeline)
// reads the same estimate.
type estimator struct {
	window, minSpan time.Duration
	// The series of the phases, by declaration index, and of the tasks, by
	// start index: the lifecycle's own indices, so that observing costs no
	// lookup.
	phases, tasks []etaSeries
}

type etaSample struct {
	at   time.Time
	done int64
}

// etaSeries is one item's samples since it started its current attempt.
type etaSeries struct {
	name    string
	attempt int
	started time.Time
	samples []etaSample // ascending in time
}

// newEstimator returns an estimator that computes rates over window and
// states none until its samples span at least minSpan.
func newEstimator(window, minSpan time.Duration) estimator {
	return estimator{window: window, minSpan: minSpan}
}

// observe sets the ETA of every phase and task of s, taken at now. s must
// list the phases and tasks in the lifecycle's order, and observations must
// come in time order; one older than the latest is used for its answer but
// not recorded.
func (e *estimator) observe(s *Snapshot, now time.Time) {
	e.phases = grow(e.phases, len(s.Phases))
	for i := range s.Phases {
		p := &s.Phases[i]
		p.ETA = e.observeItem(&e.phases[i], p.Name, p.State == PhaseRunning, p.Attempts, p.Started, p.Duration(), p.Progress, now)
	}
	e.tasks = grow(e.tasks, len(s.Tasks))
	for i := range s.Tasks {
		t := &s.Tasks[i]
		t.ETA = e.observeItem(&e.tasks[i], t.Name, t.State == TaskRunning, 1, t.Started, t.Duration(), t.Progress, now)
	}
}

// grow returns series with room for n items.
func grow(series []etaSeries, n int) []etaSeries {
	if n > len(series) {
		series = append(series, make([]etaSeries, n-len(series))...)
	}
	return series
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
	left, ok := eta.Remaining(rate, p.Done, p.Total)
	return Estimate{Rate: rate, Remaining: left, OK: ok}
}

func (e *estimator) observeItem(ser *etaSeries, name string, running bool, attempt int, started time.Time, took time.Duration, p ProgressSnapshot, now time.Time) Estimate {
	if !running {
		// Finished (or not started): the average over the whole run. Its
		// samples are of no more use.
		*ser = etaSeries{}
		return finishedEstimate(started, took, p)
	}
	if ser.name != name || ser.attempt != attempt || !ser.started.Equal(started) {
		*ser = etaSeries{name: name, attempt: attempt, started: started, samples: ser.samples[:0]}
	}
	e.record(ser, etaSample{now, p.Done})
	return e.estimate(ser, p)
}

// record appends a sample and forgets those that no longer matter: all but
// the last one before the window, so that the samples kept span at least
// the window once there is that much history. Samples denser than the
// window needs replace the latest one instead: every snapshot is an
// observation, and a health endpoint asked thousands of times a second must
// not crowd the window into a span too short to state a rate.
func (e *estimator) record(ser *etaSeries, smp etaSample) {
	n := len(ser.samples)
	switch {
	case n > 0 && smp.at.Before(ser.samples[n-1].at):
		return // out of order: not recorded
	case n > 0 && smp.at.Equal(ser.samples[n-1].at),
		n > 1 && smp.at.Sub(ser.samples[n-2].at) < e.window/(maxETASamples/2):
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

func (e *estimator) estimate(ser *etaSeries, p ProgressSnapshot) Estimate {
	first, last := ser.samples[0], ser.samples[len(ser.samples)-1]
	span := last.at.Sub(first.at)
	if span < e.minSpan || last.done <= first.done {
		return Estimate{}
	}
	return withRemaining(float64(last.done-first.done)/span.Seconds(), p)
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
	rate := eta.Average(p.Done, took)
	if rate <= 0 {
		return nil
	}
	attrs := []attribute.KeyValue{attribute.Float64(attrProgressRate, rate)}
	if p.Total > p.Done {
		attrs = append(attrs, attribute.Float64(attrProgressETA, float64(p.Total-p.Done)/rate))
	}
	return attrs
}
