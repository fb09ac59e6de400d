package app

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/metrics/prometheus"
	"github.com/phasegate/phasegate/phasetest"
	"github.com/phasegate/phasegate/server"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// wait bounds every wait on a condition: conditions hold within
// milliseconds, the bound only keeps a broken test from hanging.
const wait = 30 * time.Second

func nop(context.Context, *lifecycle.Progress) error { return nil }

// testConfig is a config for tests: loopback, an ephemeral port, no drain
// delay, a stop bound.
func testConfig() Config {
	c := DefaultConfig("svc", "127.0.0.1:0")
	c.DrainDelay = 0
	c.StopTimeout = 5 * time.Second
	return c
}

func get(t *testing.T, addr net.Addr, path string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr.String() + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func grpcStatus(t *testing.T, addr net.Addr) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	return resp.GetStatus()
}

// The port answers "starting, phase migrate" while the phases run, then
// serving, in gRPC and HTTP alike; Stop drains it.
func TestStartServeStop(t *testing.T) {
	release, migrating := make(chan struct{}), make(chan struct{})
	cfg := testConfig()
	cfg.MetricExporters = []metrics.Exporter{prometheus.Exporter()}
	a, err := New(cfg,
		lifecycle.Phase{Name: "config", Run: nop},
		lifecycle.Phase{Name: "migrate", DependsOn: []string{"config"}, Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(20, "steps")
			p.SetDone(7)
			close(migrating)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}},
	)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- a.Start(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	addr := a.Addr(ctx)
	if addr == nil {
		t.Fatal("the port was never bound")
	}
	<-migrating // the port may be bound before migrate started
	code, body := get(t, addr, "/health")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "phase migrate 7/20 steps") {
		t.Errorf("/health while migrating: %d %s", code, body)
	}
	if st := grpcStatus(t, addr); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health while migrating: %v", st)
	}
	close(release)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, addr, "/health"); code != http.StatusOK {
		t.Errorf("/health serving: %d %s", code, body)
	}
	if st := grpcStatus(t, addr); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health serving: %v", st)
	}
	for _, p := range []string{PathMetrics, PathStartup, PathLifecycle} {
		if code, _ := get(t, addr, p); code != http.StatusOK {
			t.Errorf("GET %s: %d", p, code)
		}
	}
	if err := a.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", addr.String(), time.Second); err == nil {
		t.Error("the port still accepts after Stop")
	}
}

// The App adds listen after ListenAfter and serve after every leaf, and
// serve's stop (the port's drain) runs before any phase is undone.
func TestServeStopsThePortFirst(t *testing.T) {
	var order []string // appended by the stops, which run one at a time
	var portOpenAtWarmStop error
	var a *App
	cfg := testConfig()
	cfg.ListenAfter = []string{"lock"}
	a, err := New(cfg,
		lifecycle.Phase{Name: "lock", Run: nop, Stop: func(context.Context) error { order = append(order, "lock"); return nil }},
		lifecycle.Phase{Name: "warm", DependsOn: []string{"lock"}, Run: nop, Stop: func(context.Context) error {
			order = append(order, "warm")
			c, err := net.DialTimeout("tcp", a.Addr(context.Background()).String(), time.Second)
			if err == nil {
				c.Close()
				portOpenAtWarmStop = errors.New("the port still accepted connections")
			}
			return nil
		}},
	)
	if err != nil {
		t.Fatal(err)
	}
	s := a.Lifecycle().Snapshot()
	listen, _ := s.Phase(PhaseListen)
	serve, _ := s.Phase(PhaseServe)
	if strings.Join(listen.DependsOn, ",") != "lock" || strings.Join(serve.DependsOn, ",") != "listen,warm" {
		t.Fatalf("listen after %v, serve after %v", listen.DependsOn, serve.DependsOn)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := a.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if strings.Join(order, ",") != "warm,lock" {
		t.Fatalf("stops ran in order %v", order)
	}
	if portOpenAtWarmStop != nil {
		t.Fatalf("when warm stopped: %v", portOpenAtWarmStop)
	}
}

// run's signal handling: the first signal drains; during the drain a
// second one cuts the waits short.
func TestSignalsDrainAndASecondCutsShort(t *testing.T) {
	blocked := make(chan struct{})
	a, err := New(testConfig(), lifecycle.Phase{Name: "pool", Run: nop, Stop: func(ctx context.Context) error {
		close(blocked)
		<-ctx.Done() // a stop that waits for ever unless cut short
		return ctx.Err()
	}})
	if err != nil {
		t.Fatal(err)
	}
	sigs := make(chan os.Signal, 2)
	done := make(chan error, 1)
	go func() { done <- a.run(context.Background(), sigs) }()
	if err := waitState(a, lifecycle.StateServing); err != nil {
		t.Fatal(err)
	}
	sigs <- syscall.SIGTERM
	<-blocked
	sigs <- syscall.SIGINT
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "second signal") {
			t.Fatalf("run = %v, want a drain cut short by the second signal", err)
		}
	case <-time.After(wait):
		t.Fatal("the second signal did not cut the drain short")
	}
}

// A failure after serving, the listener dying or Lifecycle.Fail, turns
// health to failing and makes Run return the cause, so that the process
// exits non-zero and its supervisor restarts it.
func TestFailureAfterServing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fail  func(a *App, l net.Listener)
		cause string
	}{
		{"listener dies", func(_ *App, l net.Listener) { _ = l.Close() }, "stopped serving"},
		{"Lifecycle.Fail", func(a *App, _ net.Listener) { _ = a.Lifecycle().Fail(errors.New("disk gone")) }, "disk gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig()
			cfg.Listener = l
			a, err := New(cfg, lifecycle.Phase{Name: "work", Run: nop})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- a.run(context.Background(), make(chan os.Signal)) }()
			if err := waitState(a, lifecycle.StateServing); err != nil {
				t.Fatal(err)
			}
			tc.fail(a, l)
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.cause) {
					t.Fatalf("run = %v, want the cause %q", err, tc.cause)
				}
			case <-time.After(wait):
				t.Fatal("run did not return after the failure")
			}
			s := a.Lifecycle().Snapshot()
			if s.State != lifecycle.StateStopped || s.Err == nil {
				t.Fatalf("final state %s, err %v; want stopped after a failure", s.State, s.Err)
			}
		})
	}
}

// A start that outlives StartTimeout fails naming the phase still running
// and its progress.
func TestStartTimeoutNamesThePhase(t *testing.T) {
	cfg := testConfig()
	cfg.StartTimeout = 200 * time.Millisecond
	a, err := New(cfg, lifecycle.Phase{Name: "reclaim", Run: func(ctx context.Context, p *lifecycle.Progress) error {
		p.SetTotal(5000, "namespaces")
		p.SetDone(1200)
		<-ctx.Done()
		return ctx.Err()
	}})
	if err != nil {
		t.Fatal(err)
	}
	err = a.Start(context.Background())
	var se *lifecycle.StartTimeoutError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "reclaim") || !strings.Contains(err.Error(), "1200/5000 namespaces") {
		t.Fatalf("Start = %v, want a StartTimeoutError naming reclaim at 1200/5000", err)
	}
	if err := a.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no name", Config{Listen: ":0"}, "Name is required"},
		{"no port", Config{Name: "x"}, "Listen, Listener or PortFrom"},
		{"negative", Config{Name: "x", Listen: ":0", DrainDelay: -1}, "DrainDelay"},
	} {
		if _, err := New(tc.cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrConfig saying %q", tc.name, err, tc.want)
		}
	}
	if _, err := New(testConfig(), lifecycle.Phase{Name: "a", DependsOn: []string{"nope"}, Run: nop}); !errors.Is(err, ErrConfig) {
		t.Errorf("an unknown dependency: %v", err)
	}
}

// waitState waits for the lifecycle to reach state.
func waitState(a *App, state lifecycle.State) error {
	ch, cancel := a.Lifecycle().Subscribe()
	defer cancel()
	timeout := time.After(wait)
	for {
		select {
		case s := <-ch:
			if s.State == state {
				return nil
			}
		case <-timeout:
			return errors.New("timed out waiting for " + string(state))
		}
	}
}

// The order the phases ran in, asserted against the port as a test of a
// separate process would, from the App's event stream.
func TestPhaseOrderOverThePort(t *testing.T) {
	a, err := New(testConfig(),
		lifecycle.Phase{Name: "config", Run: nop},
		lifecycle.Phase{Name: "migrate", DependsOn: []string{"config"}, Run: nop},
		lifecycle.Phase{Name: "register", DependsOn: []string{"migrate", PhaseListen}, Run: nop},
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })

	s := phasetest.Follow(t, "http://"+a.Addr(context.Background()).String()+PathEvents)
	phasetest.WaitState(t, s, lifecycle.StateServing, wait)
	phasetest.AssertOrder(t, s.Events(0), "config", "migrate", "register", "serve")
	phasetest.AssertRespectsDependencies(t, s.Events(0))
}

// A client following /debug/events does not hold up the stop: its stream
// ends as the port stops taking requests, with every event until then and
// no error for the follower. Before, the stream lasted until the
// lifecycle's final event, which comes after the port's drain, so the drain
// waited out its stop timeout and Stop failed ("HTTP shutdown not
// finished").
func TestStopWhileFollowed(t *testing.T) {
	a, err := New(testConfig(), lifecycle.Phase{Name: "config", Run: nop})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := phasetest.Follow(t, "http://"+a.Addr(context.Background()).String()+PathEvents)
	phasetest.WaitState(t, s, lifecycle.StateServing, wait)
	if err := a.Stop(context.Background()); err != nil {
		t.Fatalf("Stop while a client follows the events: %v", err)
	}
	phasetest.WaitState(t, s, lifecycle.StateDraining, wait)
	s.Close()
	if err := s.Err(); err != nil {
		t.Errorf("the follower: %v", err)
	}
}

// phasetest.Wrap drives an App as phasetest.New does a lifecycle: the
// start through the App (its port), the stop at the test's end.
func TestWrappedForATest(t *testing.T) {
	a, err := New(testConfig(),
		lifecycle.Phase{Name: "config", Run: nop},
		lifecycle.Phase{Name: "migrate", DependsOn: []string{"config"}, Run: nop},
	)
	if err != nil {
		t.Fatal(err)
	}
	h := phasetest.Wrap(t, a).RequireStart()
	phasetest.AssertOrder(t, h.Events(0), "config", "migrate", "serve")
	if code, body := get(t, a.Addr(context.Background()), "/health"); code != http.StatusOK {
		t.Errorf("/health after RequireStart: %d %s", code, body)
	}
	addr := a.Addr(context.Background()).String()
	h.RequireStop()
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("the port still accepts after RequireStop")
	}
}

// A wrapped App started in the background answers NOT_SERVING on its port
// while a phase holds the start, and the Harness's Drain then stops the
// App as a whole: the start returns, and the port is closed (the embedded
// Lifecycle's own Drain would have left it bound).
func TestWrappedStartInBackground(t *testing.T) {
	hold := make(chan struct{})
	a, err := New(testConfig(), lifecycle.Phase{Name: "migrate", Run: func(ctx context.Context, _ *lifecycle.Progress) error {
		select {
		case <-hold:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	h := phasetest.Wrap(t, a)
	done := h.StartInBackground()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	addr := a.Addr(ctx)
	if addr == nil {
		t.Fatal("the port was never bound")
	}
	if got := grpcStatus(t, addr); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health during the start: %v, want NOT_SERVING", got)
	}
	if err := h.Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Error("a start drained before serving returned nil")
		}
	default:
		t.Error("Drain returned before the start did")
	}
	if _, err := net.DialTimeout("tcp", addr.String(), time.Second); err == nil {
		t.Error("the port still accepts after the Harness's Drain")
	}
	close(hold)
}

// Without a metric exporter the App serves no /metrics, and its timeline
// does not link to it, yet the path stays the App's: a service cannot
// take it.
func TestMetricsOnlyWhenExported(t *testing.T) {
	a, err := New(testConfig(), lifecycle.Phase{Name: "config", Run: nop})
	if err != nil {
		t.Fatal(err)
	}
	h := phasetest.Wrap(t, a)
	h.RequireStart()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	addr := a.Addr(ctx)
	if code, _ := get(t, addr, PathMetrics); code != http.StatusNotFound {
		t.Errorf("GET %s without an exporter: %d, want 404", PathMetrics, code)
	}
	code, body := get(t, addr, PathStartup)
	if code != http.StatusOK || !strings.Contains(body, `href="`+PathLifecycle) || strings.Contains(body, `href="`+PathMetrics) {
		t.Errorf("GET %s: %d, links to %s %v (want true), to %s %v (want false)", PathStartup, code,
			PathLifecycle, strings.Contains(body, `href="`+PathLifecycle), PathMetrics, strings.Contains(body, `href="`+PathMetrics))
	}
	var reserved *server.ReservedPathError
	if err := a.Server().Handle("GET "+PathMetrics, http.NotFoundHandler()); !errors.As(err, &reserved) {
		t.Errorf("Handle(GET %s): %v, want a *server.ReservedPathError", PathMetrics, err)
	}
}
