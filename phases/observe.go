package phases

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/server"
	"github.com/phasegate/phasegate/timeline"
	"github.com/phasegate/phasegate/tracing"
)

// Operator endpoints served beside the health endpoints.
const (
	// PathMetrics serves every metric in the Prometheus text format.
	PathMetrics = "/metrics"
	// PathStartup serves the start as a timeline (HTML, SVG, no script).
	PathStartup = "/debug/startup"
	// PathLifecycle serves the lifecycle as JSON (what `phasegate status`
	// reads).
	PathLifecycle = "/debug/lifecycle"
)

// DefaultExpected are the durations after which a phase still running is
// logged as slow, with its progress: far above what a healthy host takes
// (docs/BENCHMARKS.md: thousands of namespaces reclaimed in seconds, a
// warm slot in milliseconds), well below what an orchestrator's start
// budget allows.
func DefaultExpected() map[string]time.Duration {
	return map[string]time.Duration{
		PhaseReclaim:  time.Minute,
		PhasePopulate: 30 * time.Second,
	}
}

// observer is what the daemon shows its operators beyond health: metrics
// (Prometheus at /metrics, OTLP when asked), the startup timeline, traced
// Slots calls, and a warning when a phase runs longer than expected.
type observer struct {
	provider *metrics.Provider
	checks   *metrics.HealthChecks
	acquire  metric.Float64Histogram
	reclaim  metric.Int64Counter
	stops    []func()

	mu      sync.Mutex
	pool    *pool.Pool // set by populate; read by the metrics callback
	poolReg metric.Registration
}

func newObserver(cfg Config, lc *lifecycle.Lifecycle, log *slog.Logger) (*observer, error) {
	mp, err := metrics.Setup(context.Background(), metrics.WithVersion(cfg.Version))
	if err != nil {
		return nil, err
	}
	o := &observer{provider: mp}
	fail := func(err error) (*observer, error) {
		o.close()
		return nil, err
	}
	if o.checks, err = metrics.NewHealthChecks(mp); err != nil {
		return fail(err)
	}
	stop, err := metrics.ObserveLifecycle(lc, mp)
	if err != nil {
		return fail(err)
	}
	o.stops = append(o.stops, stop)
	m := mp.Meter("github.com/phasegate/phasegate/phases")
	if o.acquire, err = m.Float64Histogram("phasegate.slot.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("Latency of Slots/Acquire calls, by gRPC status code."),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)); err != nil {
		return fail(fmt.Errorf("metrics: %w", err))
	}
	if o.reclaim, err = m.Int64Counter("phasegate.reclaim.slots",
		metric.WithDescription("Leaked slots found by reclaim, and how many were reclaimed, failed or deferred to the reconciler.")); err != nil {
		return fail(fmt.Errorf("metrics: %w", err))
	}
	expected := cfg.Expected
	if expected == nil {
		expected = DefaultExpected()
	}
	o.stops = append(o.stops, WarnSlowPhases(lc, log, expected))
	return o, nil
}

// httpCheck counts an HTTP health answer (health.Options.OnHTTPCheck).
func (o *observer) httpCheck(path string, code int) { o.checks.HTTP(path, code) }

// grpcOptions trace Slots calls (not health checks) with otelgrpc, count
// health checks and time Acquire.
func (o *observer) grpcOptions(tp trace.TracerProvider) []grpc.ServerOption {
	return []grpc.ServerOption{
		tracing.GRPCServerOption(tp, o.provider),
		grpc.ChainUnaryInterceptor(o.checks.UnaryServerInterceptor(), o.timeAcquire),
		grpc.ChainStreamInterceptor(o.checks.StreamServerInterceptor()),
	}
}

const acquireMethod = "/" + slotsServiceName + "/Acquire"

func (o *observer) timeAcquire(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod != acquireMethod {
		return handler(ctx, req)
	}
	start := time.Now()
	resp, err := handler(ctx, req)
	o.acquire.Record(context.Background(), time.Since(start).Seconds(),
		metric.WithAttributes(attribute.String("code", status.Code(err).String())))
	return resp, err
}

// mount serves /metrics and /debug/startup on srv.
func (o *observer) mount(srv *server.Server, lc *lifecycle.Lifecycle) error {
	if err := srv.Handle("GET "+PathMetrics, o.provider.Handler()); err != nil {
		return err
	}
	return srv.Handle("GET "+PathStartup, timeline.Handler(lc, timeline.Options{
		Title: "phasegate",
		Links: []timeline.Link{
			{Text: "/health", Href: "/health?pretty"},
			{Text: "/readyz?verbose", Href: "/readyz?verbose"},
			{Text: PathLifecycle, Href: PathLifecycle},
			{Text: PathMetrics, Href: PathMetrics},
		},
	}))
}

// reclaimed counts a reclaim report.
func (o *observer) reclaimed(rep *reclaim.Report) {
	ctx := context.Background()
	add := func(result string, n int) {
		o.reclaim.Add(ctx, int64(n), metric.WithAttributes(attribute.String("result", result)))
	}
	add("found", rep.Found)
	add("reclaimed", len(rep.Reclaimed))
	add("failed", len(rep.Failed))
	add("deferred", len(rep.Deferred))
}

// setPool starts reporting the pool's gauges:
//
//	phasegate.pool.size    the target number of warm slots
//	phasegate.pool.slots   by state: idle (warm), acquired, creating
func (o *observer) setPool(p *pool.Pool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pool != nil {
		return
	}
	o.pool = p
	m := o.provider.Meter("github.com/phasegate/phasegate/phases")
	size, err1 := m.Int64ObservableGauge("phasegate.pool.size", metric.WithDescription("Warm slots the pool keeps ready (--pool-size)."))
	slots, err2 := m.Int64ObservableGauge("phasegate.pool.slots", metric.WithDescription("Slots of the pool by state: idle (warm), acquired, creating."))
	if err1 != nil || err2 != nil {
		return // the SDK only fails on invalid names, which these are not
	}
	o.poolReg, _ = m.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		s := p.Snapshot()
		ob.ObserveInt64(size, int64(s.Target))
		for state, n := range map[string]int{"idle": len(s.Idle), "acquired": len(s.InUse), "creating": len(s.Creating)} {
			ob.ObserveInt64(slots, int64(n), metric.WithAttributes(attribute.String("state", state)))
		}
		return nil
	}, size, slots)
}

// close stops the observers and pushes the last metrics over OTLP.
func (o *observer) close() {
	for i := len(o.stops) - 1; i >= 0; i-- {
		o.stops[i]()
	}
	o.stops = nil
	o.mu.Lock()
	if o.poolReg != nil {
		_ = o.poolReg.Unregister()
		o.poolReg = nil
	}
	o.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = o.provider.Shutdown(ctx)
}
