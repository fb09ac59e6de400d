package lifecycle_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/phasegate/phasegate/lifecycle"
)

// running is a snapshot of one running phase with the given progress.
func running(started time.Time, attempt int, done, total int64) lifecycle.Snapshot {
	return lifecycle.Snapshot{
		State: lifecycle.StateStarting,
		Phases: []lifecycle.PhaseSnapshot{{
			Name: "reclaim", State: lifecycle.PhaseRunning, Attempts: attempt, Started: started,
			Progress: lifecycle.ProgressSnapshot{Done: done, Total: total, Unit: "namespaces"},
		}},
	}
}

// A phase that makes steady progress gets its exact rate and an estimated
// time left that falls with every observation, in step with the clock.
func TestEstimatorSteadyPhase(t *testing.T) {
	e := lifecycle.NewEstimator(2*time.Second, 300*time.Millisecond)
	t0 := time.Unix(1_700_000_000, 0)
	const rate, total = 250, 5000 // namespaces per second; 20s in all
	var last time.Duration = math.MaxInt64
	known := 0
	for step := 0; step <= 190; step++ {
		now := t0.Add(time.Duration(step) * 100 * time.Millisecond)
		done := int64(step * rate / 10)
		est := e.Observe(running(t0, 1, done, total), now).Phase("reclaim")
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
	e := lifecycle.NewEstimator(time.Second, 300*time.Millisecond)
	t0 := time.Unix(1_700_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var done int64
	for ms := 0; ms <= 2000; ms += 100 { // 1000/s
		done = int64(ms)
		e.Observe(running(t0, 1, done, 10000), at(ms))
	}
	fast := e.Observe(running(t0, 1, done, 10000), at(2000)).Phase("reclaim")
	for ms := 2100; ms <= 4000; ms += 100 { // then 100/s
		done += 10
		e.Observe(running(t0, 1, done, 10000), at(ms))
	}
	slow := e.Observe(running(t0, 1, done, 10000), at(4000)).Phase("reclaim")
	if !fast.OK || !slow.OK || math.Abs(fast.Rate-1000) > 1e-6 || math.Abs(slow.Rate-100) > 1e-6 {
		t.Fatalf("fast %+v, slow %+v: want rates 1000/s and 100/s", fast, slow)
	}
	if slow.Remaining <= fast.Remaining {
		t.Errorf("slowing down made the time left shorter: %v then %v", fast.Remaining, slow.Remaining)
	}
	// Stalled for longer than the window: no rate, no estimate.
	e.Observe(running(t0, 1, done, 10000), at(4600))
	if st := e.Observe(running(t0, 1, done, 10000), at(5200)).Phase("reclaim"); st.OK || st.Rate != 0 {
		t.Errorf("stalled phase: %+v, want no estimate", st)
	}
	// Done but still running (waiting for the kernel): a rate, no ETA.
	e.Observe(running(t0, 1, 9000, 10000), at(5500))
	if fin := e.Observe(running(t0, 1, 10000, 10000), at(6000)).Phase("reclaim"); fin.OK || fin.Rate <= 0 {
		t.Errorf("total reached: %+v, want a rate and no time left", fin)
	}
}

// A retried phase starts its count afresh, and so does its estimate; a
// burst of progress right after the start states nothing.
func TestEstimatorRetryAndBurst(t *testing.T) {
	e := lifecycle.NewEstimator(0, 0)
	t0 := time.Unix(1_700_000_000, 0)
	e.Observe(running(t0, 1, 0, 100), t0)
	e.Observe(running(t0, 1, 50, 100), t0.Add(time.Second))
	if est := e.Observe(running(t0, 2, 0, 100), t0.Add(2*time.Second)).Phase("reclaim"); est.Rate != 0 {
		t.Errorf("second attempt inherited the first one's rate: %+v", est)
	}
	if est := e.Observe(running(t0, 2, 90, 100), t0.Add(2*time.Second+10*time.Millisecond)).Phase("reclaim"); est.OK {
		t.Errorf("burst of 90 in 10ms gave an estimate: %+v", est)
	}
	// A finished phase reports its average rate and no time left.
	s := running(t0, 2, 100, 100)
	s.Phases[0].State = lifecycle.PhaseSucceeded
	s.Phases[0].Ended = t0.Add(4 * time.Second)
	if est := e.Observe(s, t0.Add(5*time.Second)).Phase("reclaim"); est.OK || math.Abs(est.Rate-25) > 1e-9 {
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
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name: "reclaim",
		Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(total, "namespaces")
			for done := range step {
				p.SetDone(done)
			}
			return nil
		},
	}}, lifecycle.WithProgressInterval(time.Millisecond), lifecycle.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	snaps, cancel := lc.Subscribe()
	defer cancel()
	started := make(chan error, 1)
	go func() { started <- lc.Start(context.Background()) }()

	e := lifecycle.NewEstimator(0, 0)
	t0 := time.Unix(1_700_000_000, 0)
	last := time.Duration(math.MaxInt64)
	for k := int64(0); k*perStep < total; k++ {
		done := k * perStep
		step <- done
		var s lifecycle.Snapshot
		for s = range snaps { // wait until the lifecycle published this step
			if p, _ := s.Phase("reclaim"); p.Progress.Done == done && p.Progress.Total == total {
				break
			}
		}
		est := e.Observe(s, t0.Add(time.Duration(k)*100*time.Millisecond)).Phase("reclaim")
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

	span := byName(rec.Ended())["phase reclaim"]
	if span == nil {
		t.Fatal("no span for the phase")
	}
	a := attrs(span)
	if r := a["phasegate.progress.rate"].AsFloat64(); r <= 0 {
		t.Errorf("span rate %v, want > 0", r)
	}
	if _, ok := a["phasegate.progress.eta_s"]; ok {
		t.Error("a phase that finished its total has an eta on its span")
	}
}

// A phase that fails halfway ends its span with the time the rest would
// have taken.
func TestSpanETAOnFailure(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name: "reclaim",
		Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(100, "namespaces")
			p.SetDone(50)
			time.Sleep(20 * time.Millisecond)
			return errors.New("netns dir unreadable")
		},
	}}, lifecycle.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err == nil {
		t.Fatal("start succeeded")
	}
	a := attrs(byName(rec.Ended())["phase reclaim"])
	rate, eta := a["phasegate.progress.rate"].AsFloat64(), a["phasegate.progress.eta_s"].AsFloat64()
	if rate <= 0 || eta <= 0 || math.Abs(eta-50/rate) > 1e-9 {
		t.Errorf("rate %v eta %v, want eta = 50/rate", rate, eta)
	}
}

func TestFormatEstimate(t *testing.T) {
	for _, tt := range []struct {
		e    lifecycle.Estimate
		want string
	}{
		{lifecycle.Estimate{}, ""},
		{lifecycle.Estimate{Rate: 2412.4}, "2412/s"},
		{lifecycle.Estimate{Rate: 81.26, Remaining: 4200 * time.Millisecond, OK: true}, "81.3/s, ~4.2s left"},
		{lifecycle.Estimate{Rate: 0.254, Remaining: 185 * time.Second, OK: true}, "0.25/s, ~3m05s left"},
		{lifecycle.Estimate{Rate: 3, Remaining: 62*time.Minute + 20*time.Second, OK: true}, "3/s, ~1h02m left"},
		{lifecycle.Estimate{Rate: 12, Remaining: 42 * time.Second, OK: true}, "12/s, ~42s left"},
	} {
		if got := tt.e.String(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.e, got, tt.want)
		}
	}
}

// Refresh keeps the rate the Estimator saw for a phase still running and
// takes the time left from the newer progress; a phase that ended since gets
// its average rate; an item the Estimator never saw gets no estimate.
func TestEstimatesRefresh(t *testing.T) {
	e := lifecycle.NewEstimator(2*time.Second, 300*time.Millisecond)
	t0 := time.Unix(1_700_000_000, 0)
	var seen lifecycle.Estimates
	for step := 0; step <= 10; step++ { // 100 namespaces per second
		seen = e.Observe(running(t0, 1, int64(step*10), 5000), t0.Add(time.Duration(step)*100*time.Millisecond))
	}
	if r := seen.Phase("reclaim").Rate; math.Abs(r-100) > 1e-6 {
		t.Fatalf("observed rate %v, want 100", r)
	}
	ended := running(t0, 1, 5000, 5000)
	ended.Phases[0].State = lifecycle.PhaseSucceeded
	ended.Phases[0].Ended = t0.Add(10 * time.Second)
	other := running(t0, 1, 10, 100)
	other.Phases[0].Name = "storage"

	tests := []struct {
		name  string
		snap  lifecycle.Snapshot
		phase string
		want  lifecycle.Estimate
	}{
		{"running, further along", running(t0, 1, 4000, 5000), "reclaim",
			lifecycle.Estimate{Rate: 100, Remaining: 10 * time.Second, OK: true}},
		{"running, total reached", running(t0, 1, 5000, 5000), "reclaim",
			lifecycle.Estimate{Rate: 100}},
		{"running, total unknown", running(t0, 1, 4000, 0), "reclaim",
			lifecycle.Estimate{Rate: 100}},
		{"ended since: average", ended, "reclaim", lifecycle.Estimate{Rate: 500}},
		{"never observed", other, "storage", lifecycle.Estimate{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := seen.Refresh(tt.snap).Phase(tt.phase)
			if got.OK != tt.want.OK || math.Abs(got.Rate-tt.want.Rate) > 1e-6 ||
				(tt.want.OK && (got.Remaining-tt.want.Remaining).Abs() > time.Millisecond) {
				t.Errorf("Refresh = %+v, want %+v", got, tt.want)
			}
		})
	}
	// Refresh records nothing: the Estimator's own view is unchanged.
	next := e.Observe(running(t0, 1, 110, 5000), t0.Add(1100*time.Millisecond)).Phase("reclaim")
	if math.Abs(next.Rate-100) > 1e-6 {
		t.Errorf("rate after Refresh calls %v, want 100", next.Rate)
	}
}
