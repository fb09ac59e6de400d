package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/server"
)

const (
	serving    = healthpb.HealthCheckResponse_SERVING
	notServing = healthpb.HealthCheckResponse_NOT_SERVING
)

// The port answers while a phase still holds startup open: HTTP 503 naming
// the phase and its progress, gRPC NOT_SERVING to grpc-go and to
// grpc-health-probe; and SERVING once startup finished.
func TestPortAnswersDuringStartup(t *testing.T) {
	bin := healthProbe(t)
	st := newStack(t, server.Config{})
	st.start(t)
	client := httpClient(t)

	resp, err := client.Get("http://" + st.addr() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	answered := time.Since(st.startAt)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("Start → port bound %v, → first HTTP answer %v", st.listenAt.Sub(st.startAt), answered)
	if answered > 5*time.Second { // sanity only; the benchmark measures it
		t.Errorf("first answer %v after Start", answered)
	}
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("GET /health = %d, want 503", resp.StatusCode)
	}
	var doc struct {
		Status, Output string
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("body: %v\n%s", err, body)
	}
	if doc.Status != "fail" || doc.Output != "starting: phase reclaim 1200/5000 namespaces" {
		t.Errorf("body status %q output %q", doc.Status, doc.Output)
	}

	conn := st.grpcConn(t)
	if got := checkHealth(t, conn, ""); got != notServing {
		t.Errorf(`Check("") = %v while starting`, got)
	}
	if code, out := probe(t, bin, st.addr()); code != 4 {
		t.Errorf("grpc-health-probe while starting: exit %d, want 4\n%s", code, out)
	}

	st.serve(t)
	// The checker applies the change on its own goroutine, a moment later.
	waitUntil(t, `Check("") to be SERVING`, func() bool { return checkHealth(t, conn, "") == serving })
	if code, out := probe(t, bin, st.addr()); code != 0 {
		t.Errorf("grpc-health-probe once serving: exit %d, want 0\n%s", code, out)
	}
	if code, out := probe(t, bin, st.addr(), "-service="+health.PhaseServicePrefix+"reclaim"); code != 0 {
		t.Errorf("grpc-health-probe -service=phasegate.phase.reclaim: exit %d\n%s", code, out)
	}
	resp, err = client.Get("http://" + st.addr() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /health once serving = %d", resp.StatusCode)
	}
}

// Watch sees NOT_SERVING → SERVING → NOT_SERVING (drain) in order, and the
// phase entries flip as their phases succeed.
func TestWatchThroughLifecycle(t *testing.T) {
	st := newStack(t, server.Config{DrainDelay: 50 * time.Millisecond})
	st.start(t)
	conn := st.grpcConn(t)
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	watch := func(service string) <-chan healthUpdate { return watchHealth(ctx, t, hc, service) }
	next := func(c <-chan healthUpdate, service string) healthUpdate {
		t.Helper()
		return recv(t, c, "a Watch update of "+service)
	}
	overall := watch("")
	reclaim := watch(health.PhaseServicePrefix + "reclaim")
	app := watch(testService)
	for _, w := range []struct {
		c       <-chan healthUpdate
		service string
	}{{overall, `""`}, {reclaim, "reclaim"}, {app, testService}} {
		if u := next(w.c, w.service); u.status != notServing {
			t.Fatalf("%s: first Watch update %v %v, want NOT_SERVING", w.service, u.status, u.err)
		}
	}
	waitUntil(t, "phase listen to be reported SERVING", func() bool {
		return checkHealth(t, conn, health.PhaseServicePrefix+"listen") == serving
	})
	checkListNamesEveryService(ctx, t, hc)

	st.serve(t)
	if u := next(reclaim, "reclaim"); u.status != serving {
		t.Errorf("reclaim: %v %v, want SERVING", u.status, u.err)
	}
	if u := next(overall, `""`); u.status != serving {
		t.Errorf(`"": %v %v, want SERVING`, u.status, u.err)
	}
	if u := next(app, testService); u.status != serving {
		t.Errorf("%s: %v %v, want SERVING", testService, u.status, u.err)
	}

	drained := make(chan error, 1)
	go func() { drained <- st.lc.Drain(context.Background()) }()
	if u := next(overall, `""`); u.status != notServing {
		t.Errorf(`"" at drain: %v %v, want NOT_SERVING`, u.status, u.err)
	}
	if u := next(app, testService); u.status != notServing {
		t.Errorf("%s at drain: %v %v, want NOT_SERVING", testService, u.status, u.err)
	}
	// The stream then ends so that the graceful stop need not wait for it.
	if u := next(overall, `""`); status.Code(u.err) != codes.Unavailable {
		t.Errorf(`"" after drain: %v %v, want the stream to end with Unavailable`, u.status, u.err)
	}
	if err := recv(t, drained, "the drain"); err != nil {
		t.Errorf("Drain: %v", err)
	}
}

// healthUpdate is one message of a health Watch stream, or the error that
// ended it.
type healthUpdate struct {
	status healthpb.HealthCheckResponse_ServingStatus
	err    error
}

// watchHealth watches service until ctx ends, each update sent on the
// channel it returns, which closes after the stream's error.
func watchHealth(ctx context.Context, t *testing.T, hc healthpb.HealthClient, service string) <-chan healthUpdate {
	t.Helper()
	stream, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatal(err)
	}
	c := make(chan healthUpdate, 16)
	go func() {
		defer close(c)
		for {
			resp, err := stream.Recv()
			if err != nil {
				c <- healthUpdate{err: err}
				return
			}
			c <- healthUpdate{status: resp.Status}
		}
	}()
	return c
}

// checkListNamesEveryService checks that List names the overall service,
// the App's and each phase's.
func checkListNamesEveryService(ctx context.Context, t *testing.T, hc healthpb.HealthClient) {
	t.Helper()
	list, err := hc.List(ctx, &healthpb.HealthListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for name := range list.Statuses {
		names = append(names, name)
	}
	for _, want := range []string{"", testService, "phasegate.phase.lock", "phasegate.phase.listen", "phasegate.phase.reclaim", "phasegate.phase.register", "phasegate.phase.serve"} {
		if _, ok := list.Statuses[want]; !ok {
			t.Errorf("List lacks %q: %q", want, names)
		}
	}
}

// Alive probes the port itself: nil before Serve, nil while the port
// answers /livez, an error naming the answer once /livez fails (a failed
// lifecycle) or the port is gone from under the server, nil again once the
// server drains.
func TestAlive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st := newStack(t, server.Config{})
	if err := st.srv.Alive(ctx); err != nil {
		t.Errorf("Alive before Serve: %v", err)
	}
	st.start(t)
	if err := st.srv.Alive(ctx); err != nil {
		t.Errorf("Alive while starting: %v", err)
	}
	st.serve(t)
	if err := st.lc.Fail(errors.New("reconciler died")); err != nil {
		t.Fatal(err)
	}
	if err := st.srv.Alive(ctx); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("Alive with a failed lifecycle: %v, want the 503 of /livez", err)
	}
	if err := st.srv.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.srv.Alive(ctx); err != nil {
		t.Errorf("Alive once drained: %v", err)
	}

	// A listener that dies under a serving server.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "x", Run: func(context.Context, *lifecycle.Progress) error { return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	hc := health.New(lc, health.Options{})
	defer hc.Close()
	srv, err := server.New(server.Config{Listener: l, Health: hc})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Drain(ctx) }()
	if err := srv.Serve(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Alive(ctx); err != nil {
		t.Errorf("Alive on a fresh port: %v", err)
	}
	_ = l.Close()
	recv(t, srv.Done(), "Done after the listener failed")
	if err := srv.Alive(ctx); err == nil {
		t.Error("Alive with the listener gone: nil")
	}
}
