package metrics_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"

	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/metrics"
	metricsconsole "github.com/phasegate/phasegate/metrics/console"
	metricsotlp "github.com/phasegate/phasegate/metrics/otlp"
	metricsprom "github.com/phasegate/phasegate/metrics/prometheus"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// scrape reads the Prometheus exposition h serves.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d\n%s", w.Code, w.Body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(w.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// sample returns the metric of family name whose labels include want.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m == nil:
		return -1
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

// clearEnv makes a test independent of the caller's OTEL_* variables.
func clearEnv(t *testing.T) {
	for _, k := range []string{
		"OTEL_SDK_DISABLED", "OTEL_METRICS_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
		"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
		"OTEL_METRIC_EXPORT_INTERVAL", "OTEL_EXPORTER_PROMETHEUS_HOST", "OTEL_EXPORTER_PROMETHEUS_PORT",
	} {
		t.Setenv(k, "")
	}
}

func setup(t *testing.T) *metrics.Provider {
	t.Helper()
	clearEnv(t)
	p, err := metrics.Setup(context.Background(), metrics.WithExporters(metricsotlp.Exporter(), metricsconsole.Exporter(), metricsprom.Exporter()), metrics.WithVersion("test"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p
}

// A start's phases, tasks, state and progress show at /metrics under their
// Prometheus names, with the values the lifecycle had.
func TestLifecycleMetrics(t *testing.T) {
	p := setup(t)
	blocked, release := make(chan struct{}), make(chan struct{})
	taskDone := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: func(context.Context, *lifecycle.Progress) error { return nil }},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, pr *lifecycle.Progress) error {
			pr.SetTotal(100, "namespaces")
			pr.SetDone(30)
			close(blocked)
			<-release
			pr.SetDone(100)
			pr.Defer("fill", func(context.Context, *lifecycle.Progress) error { close(taskDone); return nil })
			return nil
		}},
		{Name: "serve", DependsOn: []string{"reclaim"}, Run: func(context.Context, *lifecycle.Progress) error { return nil }},
	}, lifecycle.WithProgressInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	stop, err := metrics.ObserveLifecycle(lc, p)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	started := make(chan error, 1)
	go func() { started <- lc.Start(context.Background()) }()
	<-blocked

	checkMetricsWhileStarting(t, scrape(t, p.Handler()))

	close(release)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	<-taskDone
	var fam map[string]*dto.MetricFamily
	deadline := time.Now().Add(10 * time.Second)
	for { // the subscriber records the durations shortly after the events
		fam = scrape(t, p.Handler())
		if value(sample(fam, "phasegate_phase_duration_seconds", map[string]string{"phase": "serve"})) == 1 &&
			value(sample(fam, "phasegate_task_duration_seconds", map[string]string{"task": "fill"})) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("phase and task durations never recorded")
		}
		time.Sleep(5 * time.Millisecond)
	}
	checkMetricsOnceServing(t, fam)

	lc.Warn("egress", "net.ipv4.ip_forward is 0")
	fam = scrape(t, p.Handler())
	if v := value(sample(fam, "phasegate_lifecycle_warnings", map[string]string{"warning": "egress"})); v != 1 {
		t.Errorf("warning egress = %v, want 1", v)
	}
	lc.ClearWarning("egress")
	fam = scrape(t, p.Handler())
	if m := sample(fam, "phasegate_lifecycle_warnings", map[string]string{"warning": "egress"}); m != nil {
		t.Errorf("a cleared warning is still reported: %v", m)
	}
	_ = lc.Drain(context.Background())
}

// checkMetricsWhileStarting checks fams, scraped while reclaim ran with
// 30 of its 100 namespaces done.
func checkMetricsWhileStarting(t *testing.T, fams map[string]*dto.MetricFamily) {
	t.Helper()
	if v := value(sample(fams, "phasegate_lifecycle_state", map[string]string{"state": "starting"})); v != 1 {
		t.Errorf("state starting = %v, want 1", v)
	}
	if v := value(sample(fams, "phasegate_lifecycle_state", map[string]string{"state": "serving"})); v != 0 {
		t.Errorf("state serving = %v, want 0", v)
	}
	if v := value(sample(fams, "phasegate_phase_progress_done", map[string]string{"phase": "reclaim"})); v != 30 {
		t.Errorf("reclaim done = %v, want 30", v)
	}
	if v := value(sample(fams, "phasegate_phase_progress_total", map[string]string{"phase": "reclaim"})); v != 100 {
		t.Errorf("reclaim total = %v, want 100", v)
	}
	if v := value(sample(fams, "phasegate_lifecycle_since_start_seconds", nil)); v < 0 {
		t.Errorf("since_start = %v", v)
	}
	if m := sample(fams, "phasegate_lifecycle_startup_seconds", nil); m != nil {
		t.Errorf("startup duration reported while starting: %v", m)
	}
}

// checkMetricsOnceServing checks fam, scraped once the start succeeded
// and the task fill ended, and its durations were recorded.
func checkMetricsOnceServing(t *testing.T, fam map[string]*dto.MetricFamily) {
	t.Helper()
	for _, ph := range []string{"lock", "reclaim", "serve"} {
		if v := value(sample(fam, "phasegate_phase_duration_seconds", map[string]string{"phase": ph, "outcome": "succeeded"})); v != 1 {
			t.Errorf("phase %s duration count = %v, want 1", ph, v)
		}
	}
	if v := value(sample(fam, "phasegate_task_duration_seconds", map[string]string{"task": "fill", "outcome": "succeeded"})); v != 1 {
		t.Errorf("task fill duration count = %v, want 1", v)
	}
	if v := value(sample(fam, "phasegate_lifecycle_state", map[string]string{"state": "serving"})); v != 1 {
		t.Errorf("state serving = %v, want 1", v)
	}
	if v := value(sample(fam, "phasegate_lifecycle_startup_seconds", nil)); v <= 0 {
		t.Errorf("startup = %v, want > 0", v)
	}
	if m := sample(fam, "phasegate_phase_progress_done", map[string]string{"phase": "reclaim"}); m != nil {
		t.Errorf("progress of a finished phase still reported: %v", m)
	}
	if m := sample(fam, "target_info", map[string]string{"service_name": "phasegate", "service_version": "test"}); m == nil {
		t.Error("no target_info with the service name and version")
	}
	if fam["go_goroutines"] == nil || fam["process_cpu_seconds_total"] == nil {
		t.Error("no Go runtime or process metrics")
	}
}

// Health checks are counted by dialect and result, over HTTP and gRPC
// (Check and Watch), and nothing else is.
func TestHealthChecksCounted(t *testing.T) {
	p := setup(t)
	hc, err := metrics.NewHealthChecks(p)
	if err != nil {
		t.Fatal(err)
	}
	hc.HTTP("/health", http.StatusServiceUnavailable)
	hc.HTTP("/health", http.StatusOK)
	hc.HTTP("/readyz", http.StatusOK)
	hc.HTTP("/livez", http.StatusMethodNotAllowed)

	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(hc.UnaryServerInterceptor()), grpc.ChainStreamInterceptor(hc.StreamServerInterceptor()))
	hs := grpchealth.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(lis) })
	defer func() { srv.Stop(); wg.Wait() }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "unknown"}); err == nil {
		t.Fatal("unknown service answered")
	}
	stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	if r, err := stream.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", r, err)
	}
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}

	fams := scrape(t, p.Handler())
	for _, tt := range []struct {
		dialect, result string
		want            float64
	}{
		{"health", "fail", 1}, {"health", "pass", 1}, {"readyz", "pass", 1}, {"livez", "error", 1},
		{"grpc", "fail", 1}, {"grpc", "pass", 1}, {"grpc", "error", 1},
		{"grpc_watch", "fail", 1}, {"grpc_watch", "pass", 1},
	} {
		m := sample(fams, "phasegate_health_checks_total", map[string]string{"dialect": tt.dialect, "result": tt.result})
		if v := value(m); v != tt.want {
			t.Errorf("checks{dialect=%s,result=%s} = %v, want %v", tt.dialect, tt.result, v, tt.want)
		}
	}
}

// otlpCollector is an OTLP/HTTP metrics receiver on loopback that
// remembers the names of the metrics pushed to it.
type otlpCollector struct {
	URL   string
	got   chan struct{} // a push arrived
	mu    sync.Mutex
	names map[string]bool
	posts int
}

func newOTLPCollector(t testing.TB) *otlpCollector {
	t.Helper()
	c := &otlpCollector{got: make(chan struct{}, 1), names: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req colmetricpb.ExportMetricsServiceRequest
		if r.URL.Path != "/v1/metrics" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.posts++
		for _, rm := range req.GetResourceMetrics() {
			for _, sm := range rm.GetScopeMetrics() {
				for _, m := range sm.GetMetrics() {
					c.names[m.GetName()] = true
				}
			}
		}
		c.mu.Unlock()
		select {
		case c.got <- struct{}{}:
		default:
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&colmetricpb.ExportMetricsServiceResponse{})
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

func (c *otlpCollector) has(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.names[name]
}

func (c *otlpCollector) pushes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.posts
}

// waitFor waits until a push carried the metric name.
func (c *otlpCollector) waitFor(t *testing.T, name string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for !c.has(name) {
		select {
		case <-c.got:
		case <-deadline:
			t.Fatalf("%s never pushed over OTLP", name)
		}
	}
}

// With OTEL_METRICS_EXPORTER=otlp the same instruments are pushed to an
// OTLP/HTTP endpoint.
func TestOTLPExport(t *testing.T) {
	clearEnv(t)
	col := newOTLPCollector(t)
	t.Setenv("OTEL_METRICS_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "50")
	p, err := metrics.Setup(context.Background(), metrics.WithExporters(metricsotlp.Exporter(), metricsconsole.Exporter(), metricsprom.Exporter()))
	if err != nil {
		t.Fatal(err)
	}
	if !p.OTLP || p.Protocol != "http/protobuf" {
		t.Errorf("OTLP %v protocol %q", p.OTLP, p.Protocol)
	}
	hc, err := metrics.NewHealthChecks(p)
	if err != nil {
		t.Fatal(err)
	}
	hc.HTTP("/health", http.StatusOK)
	col.waitFor(t, "phasegate.health.checks")
	if err := p.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

// syncBuffer is a bytes.Buffer that the console exporter's goroutine and
// the test may share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// OTEL_METRICS_EXPORTER is a list: "otlp,console,prometheus" pushes to the
// collector and writes to the console, and /metrics serves the same
// instrument all along.
func TestSetupExporterList(t *testing.T) {
	clearEnv(t)
	col := newOTLPCollector(t)
	t.Setenv("OTEL_METRICS_EXPORTER", "otlp, Console ,prometheus,otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	var console syncBuffer
	p, err := metrics.Setup(context.Background(), metrics.WithExporters(metricsotlp.Exporter(), metricsconsole.Exporter(), metricsprom.Exporter()), metrics.WithConsoleWriter(&console))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"otlp", "console", "prometheus"}; !slices.Equal(p.Exporters, want) || !p.OTLP || p.Protocol != "http/protobuf" {
		t.Fatalf("Exporters %q OTLP %v Protocol %q, want %q over http/protobuf", p.Exporters, p.OTLP, p.Protocol, want)
	}
	hc, err := metrics.NewHealthChecks(p)
	if err != nil {
		t.Fatal(err)
	}
	hc.HTTP("/readyz", http.StatusOK)
	if v := value(sample(scrape(t, p.Handler()), "phasegate_health_checks_total", map[string]string{"dialect": "readyz"})); v != 1 {
		t.Errorf("/metrics: readyz checks = %v, want 1", v)
	}
	// Shutdown pushes to every exporter once more, whatever the interval.
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !col.has("phasegate.health.checks") {
		t.Error("phasegate.health.checks not pushed over OTLP")
	}
	if !strings.Contains(console.String(), `"Name":"phasegate.health.checks"`) {
		t.Errorf("phasegate.health.checks not on the console:\n%s", console.String())
	}
}

// OTEL_SDK_DISABLED=true: no exporter, no metric, and /metrics still
// answers (empty) so a scraper does not see a broken target.
func TestSetupSDKDisabled(t *testing.T) {
	clearEnv(t)
	col := newOTLPCollector(t)
	t.Setenv("OTEL_SDK_DISABLED", "TRUE")
	t.Setenv("OTEL_METRICS_EXPORTER", "otlp,console")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	var console syncBuffer
	p, err := metrics.Setup(context.Background(), metrics.WithExporters(metricsotlp.Exporter(), metricsconsole.Exporter(), metricsprom.Exporter()), metrics.WithConsoleWriter(&console))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Disabled || p.OTLP || len(p.Exporters) != 0 {
		t.Fatalf("Disabled %v OTLP %v Exporters %q, want disabled and nothing", p.Disabled, p.OTLP, p.Exporters)
	}
	hc, err := metrics.NewHealthChecks(p)
	if err != nil {
		t.Fatal(err)
	}
	hc.HTTP("/health", http.StatusOK)
	if fams := scrape(t, p.Handler()); len(fams) != 0 {
		t.Errorf("/metrics of a disabled provider serves %d families", len(fams))
	}
	// A provider with exporters would push once more here.
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := col.pushes(); n != 0 || console.String() != "" {
		t.Errorf("disabled, yet %d OTLP pushes and console %q", n, console.String())
	}
}

// "prometheus" in OTEL_METRICS_EXPORTER names the in-process registry: it
// opens no second port, even where OTEL_EXPORTER_PROMETHEUS_HOST and _PORT
// point (contrib's autoexport would listen there, with a registry of its
// own that the daemon's /metrics would not show).
func TestPrometheusExporterOpensNoPort(t *testing.T) {
	clearEnv(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().(*net.TCPAddr)
	_ = lis.Close()
	t.Setenv("OTEL_METRICS_EXPORTER", "prometheus")
	t.Setenv("OTEL_EXPORTER_PROMETHEUS_HOST", addr.IP.String())
	t.Setenv("OTEL_EXPORTER_PROMETHEUS_PORT", strconv.Itoa(addr.Port))
	p, err := metrics.Setup(context.Background(), metrics.WithExporters(metricsotlp.Exporter(), metricsconsole.Exporter(), metricsprom.Exporter()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Shutdown(context.Background()) }()
	if !slices.Equal(p.Exporters, []string{"prometheus"}) || p.OTLP {
		t.Errorf("Exporters %q OTLP %v", p.Exporters, p.OTLP)
	}
	again, err := net.Listen("tcp", addr.String())
	if err != nil {
		t.Fatalf("%s is taken after Setup: %v", addr, err)
	}
	_ = again.Close()
	hc, err := metrics.NewHealthChecks(p)
	if err != nil {
		t.Fatal(err)
	}
	hc.HTTP("/livez", http.StatusOK)
	if v := value(sample(scrape(t, p.Handler()), "phasegate_health_checks_total", map[string]string{"dialect": "livez"})); v != 1 {
		t.Errorf("the handler's registry lacks the instrument: livez checks = %v", v)
	}
}

// A value Setup does not know is an error naming it, never a quiet
// fallback that would drop metrics.
func TestSetupRejectsUnknownExporter(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"unknown exporter in a list", map[string]string{"OTEL_METRICS_EXPORTER": "prometheus,statsd"}, `unknown exporter "statsd"`},
		{"none beside an exporter", map[string]string{"OTEL_METRICS_EXPORTER": "otlp,none"}, `"none" cannot be listed`},
		{"unknown metrics protocol", map[string]string{"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "carrier-pigeon"},
			`OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="carrier-pigeon"`},
		{"unknown protocol", map[string]string{"OTEL_METRICS_EXPORTER": "console,otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
			`unsupported OTLP protocol "http/json"`},
		{"SDK_DISABLED not a boolean", map[string]string{"OTEL_SDK_DISABLED": "1"}, `OTEL_SDK_DISABLED="1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			p, err := metrics.Setup(context.Background(), metrics.WithExporters(metricsotlp.Exporter(), metricsconsole.Exporter(), metricsprom.Exporter()))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				_ = p.Shutdown(context.Background())
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// Given no exporter, Setup builds a no-op provider with no handler; an
// exporter the environment asks for but the binary was not given is an
// error naming the package that provides it.
func TestSetupWithoutExporters(t *testing.T) {
	clearEnv(t)
	p, err := metrics.Setup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if p.Handler() != nil {
		t.Error("Handler is not nil without a pull exporter")
	}
	if _, ok := p.MeterProvider.(metricnoop.MeterProvider); !ok {
		t.Errorf("meter provider %T, want the no-op one", p.MeterProvider)
	}
	for _, tc := range []struct{ env, pkg string }{
		{"otlp", "phasegate/metrics/otlp"},
		{"console", "phasegate/metrics/console"},
		{"prometheus", "phasegate/metrics/prometheus"},
	} {
		t.Setenv("OTEL_METRICS_EXPORTER", tc.env)
		if _, err := metrics.Setup(context.Background()); err == nil || !strings.Contains(err.Error(), tc.pkg) {
			t.Errorf("OTEL_METRICS_EXPORTER=%s: %v, want an error naming %s", tc.env, err, tc.pkg)
		}
	}
}
