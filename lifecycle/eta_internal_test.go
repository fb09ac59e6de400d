package lifecycle

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// newEstimatorForTest is newEstimator with the lifecycle's parameters in
// place of zero or less.
func newEstimatorForTest(window, minSpan time.Duration) *estimator {
	if window <= 0 {
		window = etaWindow
	}
	if minSpan <= 0 {
		minSpan = etaMinSpan
	}
	e := newEstimator(window, minSpan)
	return &e
}

// observeAt has e observe a copy of s taken at now and returns the copy,
// carrying the estimates.
func observeAt(e *estimator, s Snapshot, now time.Time) Snapshot {
	s.Phases, s.Tasks = slices.Clone(s.Phases), slices.Clone(s.Tasks)
	e.observe(&s, now)
	return s
}

// phaseETA is the estimate of s's first phase once e observed s at now.
func phaseETA(e *estimator, s Snapshot, now time.Time) Estimate {
	return observeAt(e, s, now).Phases[0].ETA
}

// running is a snapshot of one running phase with the given progress.
func running(started time.Time, attempt int, done, total int64) Snapshot {
	return Snapshot{
		State: StateStarting,
		Phases: []PhaseSnapshot{{
			Name: "reclaim", State: PhaseRunning, Attempts: attempt, Started: started,
			Progress: ProgressSnapshot{Done: done, Total: total, Unit: "namespaces"},
		}},
	}
}

// A phase that makes steady progress gets its exact rate and an estimated
// time left that falls with every observation, in step with the clock.
func TestEstimatorSteadyPhase(t *testing.T) {
	e := newEstimatorForTest(2*time.Second, 300*time.Millisecond)
	t0 := time.Unix(1_700_000_000, 0)
	const rate, total = 250, 5000 // namespaces per second; 20s in all
	var last time.Duration = math.MaxInt64
	known := 0
	for step := 0; step <= 190; step++ {
		now := t0.Add(time.Duration(step) * 100 * time.Millisecond)
		done := int64(step * rate / 10)
		est := phaseETA(e, running(t0, 1, done, total), now)
		if step < 3 {
			if est.OK || est.Rate != 0 {
				t.Fatalf("step %d: estimate %+v before the samples span the minimum", step, est)
			}
			continue
		}
		if !est.OK {
			t.Fatalf("step %d: no estimate for a steady phase: %+v", step, est)
		}
		known++
		if math.Abs(est.Rate-rate) > 1e-6 {
			t.Errorf("step %d: rate %.3f, want %d", step, est.Rate, rate)
		}
		want := time.Duration(float64(total-done) / rate * float64(time.Second))
		if d := est.Remaining - want; d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("step %d: remaining %v, want %v", step, est.Remaining, want)
		}
		if est.Remaining >= last {
			t.Errorf("step %d: remaining %v did not fall (was %v)", step, est.Remaining, last)
		}
		last = est.Remaining
	}
	if known < 180 {
		t.Errorf("only %d estimates", known)
	}
}

// The estimate follows the recent rate: a phase that slows down gets a
// longer time left, one that stalls loses its rate once the window has
// passed, and a phase that reached its total has no time left to state.
func TestEstimatorFollowsRecentRate(t *testing.T) {
	e := newEstimatorForTest(time.Second, 300*time.Millisecond)
	t0 := time.Unix(1_700_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var done int64
	for ms := 0; ms <= 2000; ms += 100 { // 1000/s
		done = int64(ms)
		observeAt(e, running(t0, 1, done, 10000), at(ms))
	}
	fast := phaseETA(e, running(t0, 1, done, 10000), at(2000))
	for ms := 2100; ms <= 4000; ms += 100 { // then 100/s
		done += 10
		observeAt(e, running(t0, 1, done, 10000), at(ms))
	}
	slow := phaseETA(e, running(t0, 1, done, 10000), at(4000))
	if !fast.OK || !slow.OK || math.Abs(fast.Rate-1000) > 1e-6 || math.Abs(slow.Rate-100) > 1e-6 {
		t.Fatalf("fast %+v, slow %+v: want rates 1000/s and 100/s", fast, slow)
	}
	if slow.Remaining <= fast.Remaining {
		t.Errorf("slowing down made the time left shorter: %v then %v", fast.Remaining, slow.Remaining)
	}
	// Stalled for longer than the window: no rate, no estimate.
	observeAt(e, running(t0, 1, done, 10000), at(4600))
	if st := phaseETA(e, running(t0, 1, done, 10000), at(5200)); st.OK || st.Rate != 0 {
		t.Errorf("stalled phase: %+v, want no estimate", st)
	}
	// Done but still running (waiting for the kernel): a rate, no ETA.
	observeAt(e, running(t0, 1, 9000, 10000), at(5500))
	if fin := phaseETA(e, running(t0, 1, 10000, 10000), at(6000)); fin.OK || fin.Rate <= 0 {
		t.Errorf("total reached: %+v, want a rate and no time left", fin)
	}
}

// A retried phase starts its count afresh, and so does its estimate; a
// burst of progress right after the start states nothing.
func TestEstimatorRetryAndBurst(t *testing.T) {
	e := newEstimatorForTest(0, 0)
	t0 := time.Unix(1_700_000_000, 0)
	observeAt(e, running(t0, 1, 0, 100), t0)
	observeAt(e, running(t0, 1, 50, 100), t0.Add(time.Second))
	if est := phaseETA(e, running(t0, 2, 0, 100), t0.Add(2*time.Second)); est.Rate != 0 {
		t.Errorf("second attempt inherited the first one's rate: %+v", est)
	}
	if est := phaseETA(e, running(t0, 2, 90, 100), t0.Add(2*time.Second+10*time.Millisecond)); est.OK {
		t.Errorf("burst of 90 in 10ms gave an estimate: %+v", est)
	}
	// A finished phase reports its average rate and no time left.
	s := running(t0, 2, 100, 100)
	s.Phases[0].State = PhaseSucceeded
	s.Phases[0].Ended = t0.Add(4 * time.Second)
	if est := phaseETA(e, s, t0.Add(5*time.Second)); est.OK || math.Abs(est.Rate-25) > 1e-9 {
		t.Errorf("finished: %+v, want 25/s over 4s", est)
	}
}

// A synthetic phase run by a real lifecycle: the test advances its progress
// and a clock of its own in lock-step, and reads the estimates from the
// snapshots the lifecycle publishes. The time left is monotone, matches the
// work left at the phase's rate, and the phase's span ends with its rate.
func TestEstimatorOnSyntheticPhase(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	const total, perStep = 2000, 40 // 40 per 100ms of the test's clock: 400/s
	step := make(chan int64)
	lc, err := New([]Phase{{
		Name: "reclaim",
		Run: func(ctx context.Context, p *Progress) error {
			p.SetTotal(total, "namespaces")
			for done := range step {
				p.SetDone(done)
			}
			return nil
		},
	}}, WithProgressInterval(time.Millisecond), WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	snaps, cancel := lc.Subscribe()
	defer cancel()
	started := make(chan error, 1)
	go func() { started <- lc.Start(context.Background()) }()

	e := newEstimatorForTest(0, 0)
	t0 := time.Unix(1_700_000_000, 0)
	last := time.Duration(math.MaxInt64)
	for k := int64(0); k*perStep < total; k++ {
		done := k * perStep
		step <- done
		var s Snapshot
		for s = range snaps { // wait until the lifecycle published this step
			if p, _ := s.Phase("reclaim"); p.Progress.Done == done && p.Progress.Total == total {
				break
			}
		}
		est := phaseETA(e, s, t0.Add(time.Duration(k)*100*time.Millisecond))
		if k < 3 {
			continue
		}
		if !est.OK {
			t.Fatalf("step %d: no estimate: %+v", k, est)
		}
		want := time.Duration(float64(total-done) / 400 * float64(time.Second))
		if d := est.Remaining - want; d < -time.Millisecond || d > time.Millisecond || est.Remaining >= last {
			t.Errorf("step %d: remaining %v, want %v and less than %v", k, est.Remaining, want, last)
		}
		last = est.Remaining
	}
	step <- total
	close(step)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	_ = lc.Drain(context.Background())

	a := map[attribute.Key]attribute.Value{}
	found := false
	for _, sp := range rec.Ended() {
		if sp.Name() == "phase reclaim" {
			found = true
			for _, kv := range sp.Attributes() {
				a[kv.Key] = kv.Value
			}
		}
	}
	if !found {
		t.Fatal("no span for the phase")
	}
	if r := a["phasegate.progress.rate"].AsFloat64(); r <= 0 {
		t.Errorf("span rate %v, want > 0", r)
	}
	if _, ok := a["phasegate.progress.eta_s"]; ok {
		t.Error("a phase that finished its total has an eta on its span")
	}
}

// Snapshots taken far more often than the window needs (a health endpoint
// under load: one every millisecond) still span the window, so the rate
// stays known and exact.
func TestEstimatorDenseObservations(t *testing.T) {
	e := newEstimatorForTest(0, 0)
	t0 := time.Unix(1_700_000_000, 0)
	const rate = 1000 // namespaces per second: one per millisecond
	for ms := 0; ms <= 8000; ms++ {
		est := phaseETA(e, running(t0, 1, int64(ms*rate/1000), 100000), t0.Add(time.Duration(ms)*time.Millisecond))
		if ms < int(etaMinSpan/time.Millisecond) {
			continue
		}
		if !est.OK || math.Abs(est.Rate-rate) > 1e-6 {
			t.Fatalf("at %dms: %+v, want %d/s and a time left", ms, est, rate)
		}
	}
	if n := len(e.phases[0].samples); n > maxETASamples {
		t.Errorf("%d samples kept, more than %d", n, maxETASamples)
	}
}

// Tasks are estimated like phases, by their own index; one that ended gets
// its average rate.
func TestEstimatorTask(t *testing.T) {
	e := newEstimatorForTest(time.Second, 300*time.Millisecond)
	t0 := time.Unix(1_700_000_000, 0)
	task := func(state TaskState, done int64, ended time.Time) Snapshot {
		return Snapshot{Tasks: []TaskSnapshot{{
			Name: "reclaim-dead", State: state, Started: t0, Ended: ended,
			Progress: ProgressSnapshot{Done: done, Total: 1000},
		}}}
	}
	var est Estimate
	for ms := 0; ms <= 1000; ms += 100 { // 200/s
		est = observeAt(e, task(TaskRunning, int64(ms/5), time.Time{}), t0.Add(time.Duration(ms)*time.Millisecond)).Tasks[0].ETA
	}
	if !est.OK || math.Abs(est.Rate-200) > 1e-6 || (est.Remaining-4*time.Second).Abs() > time.Millisecond {
		t.Errorf("running task: %+v, want 200/s and 4s left", est)
	}
	ended := observeAt(e, task(TaskSucceeded, 1000, t0.Add(2*time.Second)), t0.Add(3*time.Second)).Tasks[0].ETA
	if ended.OK || math.Abs(ended.Rate-500) > 1e-6 {
		t.Errorf("ended task: %+v, want its average 500/s and no time left", ended)
	}
}
