package health_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/health/internal/healthtest"
	"github.com/phasegate/phasegate/health/sdnotify"
	"github.com/phasegate/phasegate/lifecycle"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// A drain that arrives while reclaim still holds the start open reads as
// draining and then stopped in every dialect — never failed: /livez stays
// 200, /health and /readyz say draining, /startupz stays 503 (the start
// never completed), gRPC "" never leaves NOT_SERVING, and sd_notify sends
// STOPPING=1 with STATUS=draining and no STATUS=failed.
func TestDrainDuringStart(t *testing.T) {
	ns := healthtest.ListenNotify(t)
	r := healthtest.NewRig(t, false)
	c := health.New(r.LC, health.Options{Version: "1.2.3"})
	t.Cleanup(c.Close)
	cl := grpcHealth(t, c)
	h := health.NewHandler(c)
	n, err := sdnotify.New(r.LC, sdnotify.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	overall, _ := watch(t, cl, "")
	next(t, overall, notServing)

	r.Start(t)
	ns.WaitLine(t, "saying starting", func(l string) bool { return strings.HasPrefix(l, "STATUS=starting") })
	r.Drain(t) // held in listen's Stop: reclaim was cancelled, serve skipped
	if got := r.LC.State(); got != lifecycle.StateDraining {
		t.Fatalf("lifecycle is %s, want draining", got)
	}

	checkCutShortStart(t, h, cl, c, "draining", lifecycle.StateDraining)
	ns.WaitLine(t, "STOPPING=1", func(l string) bool { return l == "STOPPING=1" })
	ns.WaitLine(t, "STATUS=draining", func(l string) bool { return l == "STATUS=draining" })

	r.FinishDrain()
	if err := healthtest.Recv(t, r.DrainErr, "the drain"); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if err := healthtest.Recv(t, r.StartErr, "Start to return"); err == nil {
		t.Error("Start returned nil after a drain cut it short")
	}
	checkCutShortStart(t, h, cl, c, "stopped", lifecycle.StateStopped)
	ns.WaitLine(t, "STATUS=stopped", func(l string) bool { return l == "STATUS=stopped" })

	lines := ns.Snapshot()
	if i, j := slices.Index(lines, "STOPPING=1"), slices.Index(lines, "STATUS=draining"); i < 0 || j < i {
		t.Errorf("want STOPPING=1 with STATUS=draining; got %q", lines)
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "STATUS=failed") || l == "READY=1" {
			t.Errorf("sd_notify sent %q for a drain during the start: %q", l, lines)
		}
	}
	select {
	case s := <-overall:
		t.Errorf(`Watch("") sent %v; it was NOT_SERVING throughout`, s)
	default:
	}
}

// checkCutShortStart checks what every dialect but sd_notify says of a
// start a drain cut short, when the lifecycle is in state: live, not
// ready, not started, the phases cut short cancelled or skipped and never
// failed.
func checkCutShortStart(t *testing.T, h http.Handler, cl healthpb.HealthClient, c *health.Checker, when string, state lifecycle.State) {
	t.Helper()
	for _, tt := range []struct {
		path string
		code int
		body string
	}{
		{health.PathLivez, http.StatusOK, "ok"},
		{health.PathReadyz, http.StatusServiceUnavailable, "[-]lifecycle " + string(state)},
		{health.PathStartupz, http.StatusServiceUnavailable, "[-]lifecycle " + string(state)},
		{health.PathStartupz + "?verbose", http.StatusServiceUnavailable, "[-]phase/reclaim cancelled"},
		{health.PathLivez + "?verbose", http.StatusOK, "[+]lifecycle ok"},
	} {
		w := get(h, http.MethodGet, tt.path)
		if w.Code != tt.code || !strings.Contains(w.Body.String(), tt.body) {
			t.Errorf("%s: GET %s = %d %q, want %d with %q", when, tt.path, w.Code, w.Body, tt.code, tt.body)
		}
		if strings.Contains(w.Body.String(), "failed") && !strings.Contains(w.Body.String(), "check failed") {
			t.Errorf("%s: GET %s says failed: %q", when, tt.path, w.Body)
		}
	}
	w := get(h, http.MethodGet, health.PathHealth)
	doc := decodeHealth(t, w)
	if w.Code != http.StatusServiceUnavailable || doc.State != string(state) || doc.Output != string(state) {
		t.Errorf("%s: /health = %d state %q output %q, want 503 %s", when, w.Code, doc.State, doc.Output, state)
	}
	// Phases a drain cut short were cancelled or skipped, not failed.
	for name, want := range map[string]string{"phase:lock": "pass", "phase:listen": "pass", "phase:reclaim": "warn", "phase:serve": "warn"} {
		if c := doc.Checks[name]; len(c) != 1 || c[0].Status != want {
			t.Errorf("%s: /health %s = %+v, want status %s", when, name, c, want)
		}
	}
	if c := doc.Checks["phase:reclaim"]; len(c) == 1 && c[0].State != "cancelled" {
		t.Errorf("%s: phase:reclaim state %q, want cancelled", when, c[0].State)
	}
	wantStatus(t, cl, "", notServing)
	if ok, why := c.Ready(); ok || why != string(state) {
		t.Errorf("%s: Ready() = %v, %q", when, ok, why)
	}
}

// A checker shut down while the lifecycle still starts (a server drained
// ahead of its lifecycle) reads as draining at once.
func TestCheckerShutdownWhileStarting(t *testing.T) {
	r := healthtest.NewRig(t, false)
	c := health.New(r.LC, health.Options{})
	t.Cleanup(c.Close)
	r.Start(t)
	c.Shutdown()
	if ok, why := c.Ready(); ok || why != "draining" {
		t.Errorf("Ready() = %v, %q; want false, draining", ok, why)
	}
	doc := decodeHealth(t, get(health.NewHandler(c), http.MethodGet, health.PathHealth))
	if doc.State != "draining" || doc.Output != "draining" {
		t.Errorf("/health state %q output %q, want draining", doc.State, doc.Output)
	}
}
