package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/phasegate/phasegate/lifecycle"
)

// scope is the instrumentation scope of this package's instruments.
const scope = "github.com/phasegate/phasegate/metrics"

// DurationBuckets are the histogram bounds, in seconds, for phase and task
// durations: from a millisecond (lock, listen) to half an hour (a reclaim
// of a badly leaked host).
var durationBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}

// Attribute keys of the lifecycle instruments.
const (
	KeyPhase   = attribute.Key("phase")
	KeyTask    = attribute.Key("task")
	KeyOutcome = attribute.Key("outcome")
	KeyState   = attribute.Key("state")
	KeyWarning = attribute.Key("warning")
)

var lifecycleStates = []lifecycle.State{
	lifecycle.StateCreated, lifecycle.StateStarting, lifecycle.StateServing,
	lifecycle.StateDraining, lifecycle.StateStopped, lifecycle.StateFailed,
}

// ObserveLifecycle registers these instruments on mp and records into them
// until stop is called:
//
//	phasegate.phase.duration          histogram, s   phase, outcome   each phase that ran, once it ended
//	phasegate.task.duration           histogram, s   task, outcome    each background task, once it ended
//	phasegate.lifecycle.state         gauge          state            1 for the current state, 0 for the others
//	phasegate.lifecycle.degraded      gauge                           1 once a background task failed
//	phasegate.lifecycle.warnings      gauge          warning          1 for each warning set (lifecycle.Warn), absent once cleared
//	phasegate.lifecycle.since_start   gauge, s                        time since Start was called
//	phasegate.lifecycle.startup       gauge, s                        how long the start took, once serving
//	phasegate.phase.progress.done     gauge          phase            progress of each running phase
//	phasegate.phase.progress.total    gauge          phase            its total, when known
//	phasegate.phase.rate              gauge, {unit}/s phase           its recent rate, when known
//	phasegate.phase.eta               gauge, s       phase            its estimated time left, when known
//
// The durations come from a subscription, so a phase's is recorded a
// moment after it ends (a scrape at that instant may not hold it yet);
// the gauges read a snapshot at each collection. stop waits for the
// subscriber goroutine and unregisters the gauges.
func ObserveLifecycle(lc *lifecycle.Lifecycle, mp metric.MeterProvider) (stop func(), err error) {
	m := mp.Meter(scope)
	in, err := newLifecycleInstruments(m)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		in.observe(o, lc.Snapshot(), time.Now())
		return nil
	}, in.state, in.degraded, in.warnings, in.since, in.startup, in.done, in.total, in.rate, in.eta)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}

	ch, cancel := lc.Subscribe()
	var wg sync.WaitGroup
	wg.Go(func() {
		var prev lifecycle.Snapshot
		for s := range ch {
			recordEnded(in.phaseDur, in.taskDur, prev, s)
			prev = s
		}
	})
	return func() {
		cancel()
		wg.Wait()
		_ = reg.Unregister()
	}, nil
}

// lifecycleInstruments are the instruments ObserveLifecycle records into.
type lifecycleInstruments struct {
	phaseDur, taskDur         metric.Float64Histogram
	state, degraded, warnings metric.Int64ObservableGauge
	since, startup            metric.Float64ObservableGauge
	done, total               metric.Int64ObservableGauge
	rate, eta                 metric.Float64ObservableGauge
}

// newLifecycleInstruments creates the instruments on m.
func newLifecycleInstruments(m metric.Meter) (*lifecycleInstruments, error) {
	var errs []error
	kept := func(err error) { errs = append(errs, err) }
	histogram := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		kept(err)
		return h
	}
	ints := func(name, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithDescription(desc))
		kept(err)
		return g
	}
	floats := func(name, unit, desc string) metric.Float64ObservableGauge {
		opts := []metric.Float64ObservableGaugeOption{metric.WithDescription(desc)}
		if unit != "" {
			opts = append(opts, metric.WithUnit(unit))
		}
		g, err := m.Float64ObservableGauge(name, opts...)
		kept(err)
		return g
	}
	in := lifecycleInstruments{
		phaseDur: histogram("phasegate.phase.duration", "How long each startup phase ran, by outcome."),
		taskDur:  histogram("phasegate.task.duration", "How long each background task ran, by outcome."),
		state:    ints("phasegate.lifecycle.state", "1 for the lifecycle's current state, 0 for the others."),
		degraded: ints("phasegate.lifecycle.degraded", "1 once a background task failed."),
		since:    floats("phasegate.lifecycle.since_start", "s", "Time since the start began."),
		startup:  floats("phasegate.lifecycle.startup", "s", "How long the start took, from Start to serving."),
		done:     ints("phasegate.phase.progress.done", "Units of work done by each running phase."),
		total:    ints("phasegate.phase.progress.total", "Units of work of each running phase, when known."),
		rate:     floats("phasegate.phase.rate", "", "Recent units of work per second of each running phase."),
		eta:      floats("phasegate.phase.eta", "s", "Estimated time left of each running phase."),
		warnings: ints("phasegate.lifecycle.warnings", "1 for each warning the lifecycle carries: a condition that leaves it serving but needs an operator."),
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &in, nil
}

// observe reports snapshot s, taken at now, through the gauges.
func (in *lifecycleInstruments) observe(o metric.Observer, s lifecycle.Snapshot, now time.Time) {
	for _, st := range lifecycleStates {
		v := int64(0)
		if s.State == st {
			v = 1
		}
		o.ObserveInt64(in.state, v, metric.WithAttributes(KeyState.String(string(st))))
	}
	d := int64(0)
	if s.Degraded {
		d = 1
	}
	o.ObserveInt64(in.degraded, d)
	for _, w := range s.Warnings {
		o.ObserveInt64(in.warnings, 1, metric.WithAttributes(KeyWarning.String(w.Name)))
	}
	if !s.Started.IsZero() {
		o.ObserveFloat64(in.since, now.Sub(s.Started).Seconds())
	}
	if up, ok := startupDuration(s); ok {
		o.ObserveFloat64(in.startup, up.Seconds())
	}
	in.observePhases(o, s.Phases)
}

// observePhases reports each running phase's progress, rate and time left.
func (in *lifecycleInstruments) observePhases(o metric.Observer, phases []lifecycle.PhaseSnapshot) {
	for _, p := range phases {
		if p.State != lifecycle.PhaseRunning {
			continue
		}
		attrs := metric.WithAttributes(KeyPhase.String(p.Name))
		o.ObserveInt64(in.done, p.Progress.Done, attrs)
		if p.Progress.Total > 0 {
			o.ObserveInt64(in.total, p.Progress.Total, attrs)
		}
		if e := p.ETA; e.Rate > 0 {
			o.ObserveFloat64(in.rate, e.Rate, attrs)
			if e.OK {
				o.ObserveFloat64(in.eta, e.Remaining.Seconds(), attrs)
			}
		}
	}
}

// startupDuration is how long the start took, once it reached serving.
func startupDuration(s lifecycle.Snapshot) (time.Duration, bool) {
	if s.Started.IsZero() {
		return 0, false
	}
	var last time.Time
	for _, p := range s.Phases {
		if p.State != lifecycle.PhaseSucceeded {
			return 0, false
		}
		if p.Ended.After(last) {
			last = p.Ended
		}
	}
	return last.Sub(s.Started), len(s.Phases) > 0
}

// recordEnded records the duration of every phase and task that reached a
// final state between prev and s. A snapshot falling behind never loses
// one: the comparison is of states, not of events.
func recordEnded(phaseDur, taskDur metric.Float64Histogram, prev, s lifecycle.Snapshot) {
	ctx := context.Background()
	for i, p := range s.Phases {
		if !p.State.Done() || p.State == lifecycle.PhaseSkipped || p.Started.IsZero() {
			continue
		}
		if i < len(prev.Phases) && prev.Phases[i].State.Done() {
			continue
		}
		phaseDur.Record(ctx, p.Duration().Seconds(), metric.WithAttributes(
			KeyPhase.String(p.Name), KeyOutcome.String(string(p.State))))
	}
	for i, t := range s.Tasks {
		if t.State == lifecycle.TaskRunning {
			continue
		}
		if i < len(prev.Tasks) && prev.Tasks[i].State != lifecycle.TaskRunning {
			continue
		}
		taskDur.Record(ctx, t.Duration().Seconds(), metric.WithAttributes(
			KeyTask.String(t.Name), KeyOutcome.String(string(t.State))))
	}
}
