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

// Every snapshot of a running lifecycle carries its phases' estimate, the
// one every view reads: a rate once the phase has run for a while, then its
// average once it has ended.
func TestSnapshotsCarryETA(t *testing.T) {
	release := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name: "reclaim",
		Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(1_000_000, "namespaces")
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-release:
					return nil
				case <-tick.C:
					p.Add(10)
				}
			}
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- lc.Start(context.Background()) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, _ := lc.Snapshot().Phase("reclaim")
		if p.State == lifecycle.PhaseRunning && p.ETA.OK && p.ETA.Rate > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no estimate on the snapshots: last %+v", p)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(release)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	p, _ := lc.Snapshot().Phase("reclaim")
	if p.ETA.OK || math.Abs(p.ETA.Rate-float64(p.Progress.Done)/p.Duration().Seconds()) > 1e-6 {
		t.Errorf("ended phase: %+v, want its average rate and no time left", p.ETA)
	}
	_ = lc.Drain(context.Background())
}
