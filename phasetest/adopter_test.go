package phasetest_test

// This file is the example to copy: a service declares its startup as
// phases, and its tests assert the order they ran in, in process and
// against the running process's port.

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/phasegate/phasegate/eventstream"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/phasetest"
)

// appPhases stands for the service's own graph: the port binds right after
// the lock, beside the clean-up, and serving waits for both.
func appPhases() []lifecycle.Phase {
	work := func(ctx context.Context, p *lifecycle.Progress) error { return nil }
	return []lifecycle.Phase{
		{Name: "lock", Run: work},
		{Name: "listen", DependsOn: []string{"lock"}, Run: work},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(3, "namespaces")
			p.Add(3)
			return nil
		}},
		{Name: "storage", DependsOn: []string{"reclaim"}, Run: work},
		{Name: "serve", DependsOn: []string{"listen", "storage"}, Run: work},
	}
}

// In process: the start and stop are tied to the test, and the order is
// asserted from the lifecycle's event log.
func TestStartupOrder(t *testing.T) {
	h := phasetest.New(t, appPhases()).RequireStart()
	phasetest.AssertOrder(t, h.Events(0), "lock", "reclaim", "storage", "serve")
	phasetest.AssertOrder(t, h.Events(0), "lock", "listen", "serve")
	phasetest.AssertRespectsDependencies(t, h.Events(0))
}

// Black-box: the same assertions against a running process, through the
// event stream it serves. Here the "process" is a lifecycle behind an
// httptest server; a real test points Follow at the daemon's port.
func TestStartupOrderOverThePort(t *testing.T) {
	url := startApp(t)

	s := phasetest.Follow(t, url)
	phasetest.WaitState(t, s, lifecycle.StateServing, time.Minute)
	phasetest.AssertOrder(t, s.Events(0), "lock", "reclaim", "storage", "serve")
	phasetest.AssertRespectsDependencies(t, s.Events(0))
}

// Waiting for one phase, and recording events with a hook.
func TestWaitForAPhase(t *testing.T) {
	var rec phasetest.Recorder
	h := phasetest.New(t, appPhases(), lifecycle.WithEventHook(rec.Record))
	go func() { _ = h.Start(context.Background()) }()

	e := phasetest.WaitPhase(t, &rec, "reclaim", lifecycle.PhaseSucceeded, time.Minute)
	if e.Attempt != 1 {
		t.Errorf("reclaim succeeded on attempt %d", e.Attempt)
	}
	phasetest.WaitState(t, h, lifecycle.StateServing, time.Minute)
	h.RequireStop()
	phasetest.WaitState(t, &rec, lifecycle.StateStopped, time.Minute)
	phasetest.AssertConsistent(t, rec.Events(0))
}

// startApp starts the service the way its main does, serving its events at
// the returned URL, and stops it when the test ends.
func startApp(t *testing.T) string {
	t.Helper()
	lc, err := lifecycle.New(appPhases())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(eventstream.NewHandler(lc))
	started := make(chan error, 1)
	go func() { started <- lc.Start(context.Background()) }()
	t.Cleanup(func() {
		_ = lc.Drain(context.Background())
		<-started
		srv.Close()
	})
	return srv.URL
}
