package phasetest_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/phasetest"
)

// newApp is an App with app.DefaultConfig on a free port, its drain delay
// set to delay, and one phase.
func newApp(t *testing.T, delay time.Duration) *app.App {
	t.Helper()
	cfg := app.DefaultConfig("wrapped", "127.0.0.1:0")
	cfg.DrainDelay = delay
	a, err := app.New(cfg, lifecycle.Phase{Name: "config", Run: func(context.Context, *lifecycle.Progress) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A wrapped App stops without its drain delay unless the test asks for
// it: with a delay of a minute, the Harness's own bound, a stop that
// waited it out would fail the test. One that keeps the delay waits it
// out, and its port answers NOT_SERVING meanwhile.
func TestWrapStopsWithoutTheDrainDelay(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		h := phasetest.Wrap(t, newApp(t, time.Minute))
		h.Timeout = 30 * time.Second
		h.RequireStart().RequireStop()
	})
	t.Run("at cleanup", func(t *testing.T) {
		var took time.Duration
		t.Run("wrapped", func(t *testing.T) {
			var start time.Time
			// Registered first, so run last: after the Harness's stop.
			t.Cleanup(func() { took = time.Since(start) })
			phasetest.Wrap(t, newApp(t, time.Minute)).RequireStart()
			start = time.Now()
		})
		if took >= time.Minute {
			t.Errorf("the cleanup's stop took %v: it waited out the drain delay", took)
		}
	})
	t.Run("KeepDrainDelay", func(t *testing.T) {
		const delay = 300 * time.Millisecond
		a := newApp(t, delay)
		h := phasetest.Wrap(t, a)
		h.KeepDrainDelay = true
		h.RequireStart()
		url := "http://" + a.Addr(context.Background()).String() + "/health"
		stopped := make(chan time.Duration, 1)
		start := time.Now()
		go func() {
			h.RequireStop()
			stopped <- time.Since(start)
		}()
		sawDraining := false
		for !sawDraining && time.Since(start) < delay {
			resp, err := http.Get(url)
			if err == nil {
				sawDraining = resp.StatusCode == http.StatusServiceUnavailable
				resp.Body.Close()
			}
			time.Sleep(10 * time.Millisecond)
		}
		if took := <-stopped; took < delay {
			t.Errorf("a stop that keeps the drain delay took %v, less than the delay, %v", took, delay)
		}
		if !sawDraining {
			t.Error("the port never answered 503 during the drain delay")
		}
	})
}
