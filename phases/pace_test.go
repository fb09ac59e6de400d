package phases

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/reclaim"
)

// A wait gauge keeps the longest wait since it was last taken, whatever
// the order and concurrency of the observations.
func TestWaitGauge(t *testing.T) {
	tests := []struct {
		name string
		obs  []time.Duration
		want time.Duration
	}{
		{"none", nil, 0},
		{"one", []time.Duration{3 * time.Millisecond}, 3 * time.Millisecond},
		{"longest first", []time.Duration{9 * time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond}, 9 * time.Millisecond},
		{"longest last", []time.Duration{1, 2, 3, 70 * time.Millisecond}, 70 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var g waitGauge
			var wg sync.WaitGroup
			for _, d := range tt.obs {
				wg.Go(func() { g.observe(d) })
			}
			wg.Wait()
			if got := g.take(); got != tt.want {
				t.Errorf("take() = %v, want %v", got, tt.want)
			}
			if got := g.take(); got != 0 {
				t.Errorf("second take() = %v, want 0 (taken)", got)
			}
		})
	}
}

// The health signal is the lag probe's worst only when a health check was
// answered meanwhile (a gRPC Check through the interceptor, or an HTTP
// answer): a busy machine slows the reclaim only when somebody waits.
func TestHealthSignal(t *testing.T) {
	var w waits
	w.health.observe(30 * time.Millisecond)
	if got := w.healthWorst(); got != 0 {
		t.Errorf("no check answered: health signal %v, want 0", got)
	}
	ok := func(context.Context, any) (any, error) { return nil, nil }
	if _, err := w.countChecks(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: phasegatev1.Slots_Get_FullMethodName}, ok); err != nil {
		t.Fatal(err)
	}
	w.health.observe(30 * time.Millisecond)
	if got := w.healthWorst(); got != 0 {
		t.Errorf("only a Slots call: health signal %v, want 0", got)
	}
	if _, err := w.countChecks(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: healthpb.Health_Check_FullMethodName}, ok); err != nil {
		t.Fatal(err)
	}
	w.health.observe(30 * time.Millisecond)
	if got := w.healthWorst(); got != 30*time.Millisecond {
		t.Errorf("after a gRPC Check: health signal %v, want 30ms", got)
	}
	w.checked() // an HTTP answer
	w.health.observe(12 * time.Millisecond)
	if got := w.healthWorst(); got != 12*time.Millisecond {
		t.Errorf("after an HTTP check: health signal %v, want 12ms", got)
	}
}

// The lag probe reports how late it wakes up, and ends with its context.
func TestProbeLag(t *testing.T) {
	var w waits
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.probeLag(ctx) }()
	// A timer never fires early, so the first wake-up already reports a
	// lag above zero: wait for it rather than for a guessed time.
	deadline := time.Now().Add(time.Minute)
	for w.health.worst.Load() <= 0 {
		if time.Now().After(deadline) {
			t.Fatal("the lag probe reported nothing within a minute")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the lag probe did not end with its context")
	}
	w.checked()
	if got := w.healthWorst(); got <= 0 {
		t.Errorf("lag after a wake-up = %v, want > 0", got)
	}
}

// The create signal is the longest creation only while the pool is short
// of its ready floor: a fill above it is nobody's wait. Either way the
// gauge is taken, so a creation is never counted twice.
func TestCreateSignal(t *testing.T) {
	tests := []struct {
		name  string
		short bool
		obs   time.Duration
		want  time.Duration
	}{
		{"pool short: counted", true, 80 * time.Millisecond, 80 * time.Millisecond},
		{"pool at its floor: a fill waits for nobody", false, 80 * time.Millisecond, 0},
		{"nothing made", true, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w waits
			sig := w.signals(func() bool { return tt.short })
			var create func() time.Duration
			for _, s := range sig {
				if s.Name == signalCreate {
					create = s.Worst
				}
			}
			if create == nil {
				t.Fatalf("no %q signal in %v", signalCreate, sig)
			}
			w.create.observe(tt.obs)
			if got := create(); got != tt.want {
				t.Errorf("create signal %v, want %v", got, tt.want)
			}
			if got := w.create.take(); got != 0 {
				t.Errorf("gauge left at %v after the signal was read, want taken", got)
			}
		})
	}
}

// The pacer is idle (a teardown may overlap its batches) only while
// nothing waits: no health check answered, no Acquire, no creation while
// the pool is short; each signal's Waiting says so without taking it.
func TestPacerIdle(t *testing.T) {
	tests := []struct {
		name  string
		short bool
		do    func(w *waits)
		want  bool
	}{
		{"nothing", true, func(*waits) {}, true},
		{"a health check answered", false, func(w *waits) { w.checked() }, false},
		{"an Acquire", false, func(w *waits) { w.acquire.observe(time.Millisecond) }, false},
		{"a creation, the pool short", true, func(w *waits) { w.create.observe(time.Millisecond) }, false},
		{"a creation above the floor", false, func(w *waits) { w.create.observe(time.Millisecond) }, true},
		{"a check answered, then the signals read", false, func(w *waits) { w.checked(); w.healthWorst() }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w waits
			p, err := reclaim.NewPacer(reclaim.PaceOptions{Signals: w.signals(func() bool { return tt.short })})
			if err != nil {
				t.Fatal(err)
			}
			tt.do(&w)
			if got := p.Idle(); got != tt.want {
				t.Errorf("Idle() = %v, want %v", got, tt.want)
			}
			if tt.want == false && w.checks.Load() == 0 && w.acquire.worst.Load() == 0 && w.create.worst.Load() == 0 {
				t.Error("Idle took what it read")
			}
		})
	}
}

// The background reclaim's Ps are added for as long as it runs and taken
// back after: to the runtime's default, or to the operator's GOMAXPROCS.
func TestReclaimProcs(t *testing.T) {
	for _, tc := range []struct {
		name, env string
		workers   int
		want      int // Ps during the reclaim, above the ones before it
	}{
		{"default", "", 16, 8},
		{"operator's GOMAXPROCS", "3", 16, 8},
		{"one worker", "", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOMAXPROCS", tc.env)
			if tc.env != "" {
				n, _ := strconv.Atoi(tc.env)
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(n))
			} else {
				runtime.SetDefaultGOMAXPROCS()
			}
			before := runtime.GOMAXPROCS(0)
			restore := reclaimProcs(tc.workers)
			if got := runtime.GOMAXPROCS(0); got != before+tc.want {
				t.Errorf("during the reclaim GOMAXPROCS = %d, want %d + %d", got, before, tc.want)
			}
			restore()
			if got := runtime.GOMAXPROCS(0); got != before {
				t.Errorf("after the reclaim GOMAXPROCS = %d, want %d as before", got, before)
			}
		})
	}
	runtime.SetDefaultGOMAXPROCS()
}
