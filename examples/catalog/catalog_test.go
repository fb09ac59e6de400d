package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/examples/catalog/catalogdb"
	"github.com/phasegate/phasegate/examples/catalog/catalogv1"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/phasetest"
	"github.com/phasegate/phasegate/phasetest/proc"
)

// wait bounds every wait for a condition: they hold within milliseconds;
// the bound only keeps a broken test from hanging.
// bins are the binaries the tests run, built once and removed at the end.
var bins proc.Builds

func TestMain(m *testing.M) { os.Exit(bins.Main(m)) }

const wait = time.Minute

// The phases ran in the declared order, in process: five lines.
func TestStartupOrder(t *testing.T) {
	cfgFile, _ := writeConfig(t, 100)
	a := startCatalog(t, testConfig(), cfgFile)
	phasetest.AssertOrder(t, a.Lifecycle().Events(0), "config", "migrate", "warm", "register", "serve")
	phasetest.AssertOrder(t, a.Lifecycle().Events(0), "config", "listen", "register")
	phasetest.AssertRespectsDependencies(t, a.Lifecycle().Events(0))
}

// The same, black-box: the built binary on a loopback port, its order read
// from its event stream.
func TestStartupOrderOfTheProcess(t *testing.T) {
	cfgFile, _ := writeConfig(t, 100)
	p := proc.Start(t, bins.Build(t, "."), proc.Args("-listen", "127.0.0.1:0", "-config", cfgFile))
	s := p.Follow()
	phasetest.WaitState(t, s, lifecycle.StateServing, wait)
	phasetest.AssertOrder(t, s.Events(0), "config", "migrate", "warm", "register", "serve")
}

// Once serving, the catalog answers over gRPC and HTTP on its one port, and
// its start is traced: a span per phase, one per migration under migrate's.
func TestServes(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg := testConfig()
	cfg.TracerProvider = tp
	cfgFile, _ := writeConfig(t, 100)
	a := startCatalog(t, cfg, cfgFile)
	addr := a.Addr(context.Background()).String()

	conn := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if st := healthOf(t, conn); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health: %v, want SERVING", st)
	}
	c := catalogv1.NewClient(conn)
	p, err := c.Get(ctx, catalogdb.SKU(42))
	if err != nil {
		t.Fatal(err)
	}
	got := p.AsMap()
	for k, want := range map[string]any{"title": "Product 42", "price_cents": 4242.0, "currency": "EUR", "category": "kitchen"} {
		if got[k] != want {
			t.Errorf("product 42: %s = %v, want %v (%v)", k, got[k], want, got)
		}
	}
	if n, err := c.Count(ctx); err != nil || n != 100 {
		t.Errorf("Count = %d, %v; want 100", n, err)
	}
	if _, err := c.Get(ctx, "SKU-nope"); status.Code(err) != codes.NotFound {
		t.Errorf("Get of an unknown SKU: %v, want NotFound", err)
	}
	code, body := get(t, addr, "/v1/products/"+catalogdb.SKU(7))
	if code != http.StatusOK || !strings.Contains(body, `"title":"Product 7"`) {
		t.Errorf("GET /v1/products/%s: %d %s", catalogdb.SKU(7), code, body)
	}

	var migrate sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "phase migrate" {
			migrate = s
		}
	}
	if migrate == nil {
		t.Fatal("no span for phase migrate")
	}
	var steps int
	for _, s := range rec.Ended() {
		if strings.HasPrefix(s.Name(), "migration ") {
			steps++
			if s.Parent().SpanID() != migrate.SpanContext().SpanID() {
				t.Errorf("span %q is not a child of phase migrate", s.Name())
			}
		}
	}
	if steps != catalogdb.Migrations() {
		t.Errorf("%d migration spans, want %d", steps, catalogdb.Migrations())
	}
}

// A second catalog on the same store waits in migrate, and says so to
// every client: health, the gRPC service and the HTTP route. It serves
// once the first lets go of the store.
func TestWaitsForTheStoreLock(t *testing.T) {
	cfgFile, dbPath := writeConfig(t, 10)
	holder, err := bolt.Open(dbPath, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	a, err := newCatalog(testConfig(), cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	started := make(chan error, 1)
	go func() { started <- a.Start(context.Background()) }()

	phasetest.WaitSnapshot(t, a.Lifecycle(), "migrate waiting for the lock", wait, func(s lifecycle.Snapshot) bool {
		p, _ := s.Phase("migrate")
		return strings.Contains(p.Progress.Message, "waiting for the lock")
	})
	addr := a.Addr(context.Background()).String()
	want := "starting: phase migrate waiting for the lock on " + dbPath
	if code, body := get(t, addr, "/health"); code != http.StatusServiceUnavailable || !strings.Contains(body, want) {
		t.Errorf("/health while locked out: %d %s; want 503 saying %q", code, body, want)
	}
	if code, body := get(t, addr, "/v1/products/"+catalogdb.SKU(1)); code != http.StatusServiceUnavailable || !strings.Contains(body, want) {
		t.Errorf("the route while locked out: %d %s; want 503 saying %q", code, body, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, err := catalogv1.NewClient(dial(t, addr)).Count(ctx); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), want) {
		t.Errorf("Count while locked out: %v; want Unavailable saying %q", err, want)
	}

	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, addr, "/v1/products/"+catalogdb.SKU(1)); code != http.StatusOK {
		t.Errorf("the route once serving: %d %s", code, body)
	}
}

// The process, black-box: it serves, traces its start to the console,
// drains on SIGTERM and exits 0.
func TestProcessServesTracesAndStops(t *testing.T) {
	cfgFile, _ := writeConfig(t, 100)
	p := proc.Start(t, bins.Build(t, "."), proc.Env("OTEL_TRACES_EXPORTER=console"), proc.Args("-listen", "127.0.0.1:0", "-config", cfgFile))
	addr := p.Addr()
	s := p.Follow()
	phasetest.WaitState(t, s, lifecycle.StateServing, wait)
	if code, body := get(t, addr, "/v1/products/"+catalogdb.SKU(42)); code != http.StatusOK || !strings.Contains(body, `"price_cents":4242`) {
		t.Errorf("GET a product: %d %s", code, body)
	}
	var view app.View
	if err := json.Unmarshal([]byte(mustGet(t, addr, app.PathLifecycle)), &view); err != nil {
		t.Fatal(err)
	}
	for _, ph := range view.Phases {
		if ph.Name == "migrate" && (ph.Progress.Done != 20 || ph.Progress.Total != 20 || ph.Progress.Unit != "migrations") {
			t.Errorf("migrate's progress: %+v, want 20/20 migrations", ph.Progress)
		}
	}

	p.Signal(syscall.SIGTERM)
	if code := p.Wait(wait); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	requireLines(t, p.Output(), "msg=lifecycle state=draining from=serving", "msg=lifecycle state=stopped from=draining")

	// The console exporter writes one JSON span per line, flushed at exit.
	spans := map[string]consoleSpan{}
	var steps []consoleSpan
	for _, line := range strings.Split(p.Output(), "\n") {
		var sp consoleSpan
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &sp) != nil {
			continue
		}
		spans[sp.Name] = sp
		if strings.HasPrefix(sp.Name, "migration ") {
			steps = append(steps, sp)
		}
	}
	for _, name := range []string{"startup", "phase config", "phase migrate", "phase warm", "phase register", "phase serve", "drain", "stop migrate"} {
		if _, ok := spans[name]; !ok {
			t.Errorf("no span %q on the console", name)
		}
	}
	if len(steps) != catalogdb.Migrations() {
		t.Errorf("%d migration spans on the console, want %d", len(steps), catalogdb.Migrations())
	}
	for _, sp := range steps {
		if sp.Parent.SpanID != spans["phase migrate"].SpanContext.SpanID {
			t.Errorf("span %q's parent is %s, not phase migrate's", sp.Name, sp.Parent.SpanID)
		}
	}
}

type consoleSpan struct {
	Name        string
	SpanContext struct{ SpanID string }
	Parent      struct{ SpanID string }
}

// A SIGTERM while the start waits is an orderly stop: migrate is
// cancelled, nothing after it runs, and the process exits 0.
func TestProcessStopsWhileWaitingForTheLock(t *testing.T) {
	cfgFile, dbPath := writeConfig(t, 10)
	holder, err := bolt.Open(dbPath, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	// The race detector sleeps a second at exit by default, which the
	// exit's timing below must not count.
	p := proc.Start(t, bins.Build(t, "."), proc.Env("GORACE=atexit_sleep_ms=0"), proc.Args("-listen", "127.0.0.1:0", "-config", cfgFile))
	addr := p.Addr()
	t.Run("waiting", func(t *testing.T) {
		s := phasetest.Follow(t, "http://"+addr+app.PathEvents)
		phasetest.WaitPhase(t, s, "migrate", lifecycle.PhaseRunning, wait)
	})
	eventually(t, "/health saying migrate waits for the lock", func() bool {
		code, body := get(t, addr, "/health")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "waiting for the lock on "+dbPath)
	})

	// The default drain delay (5 s) is not spent on a port that never
	// served: the process exits in well under a second.
	signalled := time.Now()
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(wait); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if took := time.Since(signalled); took >= time.Second {
		t.Errorf("the process exited %v after SIGTERM during the start, want well under a second", took)
	}
	requireLines(t, p.Output(),
		"msg=lifecycle state=draining from=starting",
		`msg="phase ended" phase=migrate state=cancelled`,
		`msg="phase ended" phase=warm state=skipped`,
		"msg=lifecycle state=stopped from=draining")
}

// A client following the event stream when the process is told to stop
// does not hold the stop up: the stream ends, with every event until then,
// as the port stops taking requests, and the process exits 0. (It used to
// last until the lifecycle's final event, after the port's drain, so the
// drain waited out its stop timeout and the process exited 1.)
func TestProcessStopsWhileFollowed(t *testing.T) {
	cfgFile, _ := writeConfig(t, 10)
	p := proc.Start(t, bins.Build(t, "."), proc.Args("-listen", "127.0.0.1:0", "-config", cfgFile))
	s := p.Follow()
	phasetest.WaitState(t, s, lifecycle.StateServing, wait)
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(wait); code != 0 {
		t.Fatalf("exit code %d after SIGTERM with a follower, want 0", code)
	}
	phasetest.WaitState(t, s, lifecycle.StateDraining, wait)
}

// requireLines fails the test unless out has each line fragment, in order.
func requireLines(t *testing.T, out string, lines ...string) {
	t.Helper()
	rest := out
	for _, l := range lines {
		i := strings.Index(rest, l)
		if i < 0 {
			t.Fatalf("the output lacks %q (in this order: %q)", l, lines)
		}
		rest = rest[i+len(l):]
	}
}

// A bad configuration fails the start before the port ever opens, and
// the process exits 1 saying what is wrong.
func TestProcessRefusesABadConfiguration(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "catalog.json")
	if err := os.WriteFile(cfgFile, []byte(`{"db": "x.db", "prodcts": 10}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := proc.Start(t, bins.Build(t, "."), proc.Args("-listen", "127.0.0.1:0", "-config", cfgFile))
	if code := p.Wait(wait); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	out := p.Output()
	if !strings.Contains(out, `unknown field \"prodcts\"`) {
		t.Errorf("the output does not name the unknown field:\n%s", out)
	}
	if strings.Contains(out, "msg=listening") {
		t.Errorf("the port opened despite the bad configuration:\n%s", out)
	}
}

// testConfig is the App's configuration for tests: an ephemeral loopback
// port, no drain delay.
func testConfig() app.Config {
	c := app.DefaultConfig("catalog", "127.0.0.1:0")
	c.DrainDelay = 0
	return c
}

// writeConfig writes a configuration file for a store of products demo
// products in a new directory, and returns its path and the store's.
func writeConfig(t *testing.T, products int) (cfgFile, db string) {
	t.Helper()
	dir := t.TempDir()
	db = filepath.Join(dir, "catalog.db")
	cfgFile = filepath.Join(dir, "catalog.json")
	b, err := json.Marshal(catalogdb.Config{DB: db, Products: products})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return cfgFile, db
}

// startCatalog starts a catalog in process and stops it when the test
// ends.
func startCatalog(t *testing.T, cfg app.Config, cfgFile string) *app.App {
	t.Helper()
	a, err := newCatalog(cfg, cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	phasetest.Wrap(t, a).RequireStart()
	return a
}

// eventually polls cond until it holds, for what only an outside client
// can see.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func healthOf(t *testing.T, conn *grpc.ClientConn) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	return resp.GetStatus()
}

func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: wait}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	c.CloseIdleConnections()
	return resp.StatusCode, string(b)
}

func mustGet(t *testing.T, addr, path string) string {
	t.Helper()
	code, body := get(t, addr, path)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	return body
}
