package app

import (
	"context"
	"net/http"
	"time"

	"google.golang.org/grpc"

	"github.com/phasegate/phasegate/app/status"
	"github.com/phasegate/phasegate/eventstream"
	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/health/sdnotify"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/server"
	"github.com/phasegate/phasegate/timeline"
	"github.com/phasegate/phasegate/tracing"
)

// setupTracer takes the configured tracer provider, or builds one from
// the environment, which the App then flushes at its end.
func (a *App) setupTracer() error {
	a.tracer = a.cfg.TracerProvider
	if a.tracer == nil {
		tp, err := tracing.Setup(context.Background(), tracing.WithServiceName(a.cfg.Name), tracing.WithVersion(a.cfg.Version),
			tracing.WithExporters(a.cfg.TraceExporters...))
		if err != nil {
			return err
		}
		a.ownTP, a.tracer = tp, tp
	}
	return nil
}

// setupLifecycle builds the lifecycle over the phases and the App's own,
// traced, with its events logged.
func (a *App) setupLifecycle(phases []lifecycle.Phase) error {
	cfg := a.cfg
	if err := checkPhases(phases); err != nil {
		return err
	}
	graph := a.graph(phases)
	a.stopBudget = stopBudget(graph, cfg)
	logEvent, setLC := EventLogger(a.log)
	opts := []lifecycle.Option{
		lifecycle.WithTracerProvider(a.tracer),
		lifecycle.WithSpanAttributes(a.spanAttributes),
		lifecycle.WithProgressInterval(100 * time.Millisecond),
		lifecycle.WithStartTimeout(cfg.StartTimeout),
		lifecycle.WithEventHook(func(e lifecycle.Event) {
			logEvent(e)
			a.mu.Lock()
			a.loggedSeq = e.Seq
			if a.logWake != nil {
				close(a.logWake)
				a.logWake = nil
			}
			a.mu.Unlock()
			if e.Final() {
				close(a.logged)
			}
		}),
	}
	if cfg.StopTimeout > 0 {
		opts = append(opts, lifecycle.WithStopTimeout(cfg.StopTimeout))
	}
	var err error
	if a.lc, err = lifecycle.New(graph, append(opts, cfg.LifecycleOptions...)...); err != nil {
		return err
	}
	a.startBudget = startBudget(graph, cfg)
	setLC(a.lc)
	return nil
}

// setupObservers builds what watches the lifecycle besides the log:
// metrics, warnings of slow phases and the health checker. It returns the
// health checks' metrics, which the server's interceptors count into.
func (a *App) setupObservers() (*metrics.HealthChecks, error) {
	cfg := a.cfg
	var err error
	if a.metrics, err = metrics.Setup(context.Background(), metrics.WithServiceName(cfg.Name), metrics.WithVersion(cfg.Version),
		metrics.WithExporters(cfg.MetricExporters...)); err != nil {
		return nil, err
	}
	checks, err := metrics.NewHealthChecks(a.metrics)
	if err != nil {
		return nil, err
	}
	stop, err := metrics.ObserveLifecycle(a.lc, a.metrics)
	if err != nil {
		return nil, err
	}
	a.stops = append(a.stops, stop, WarnSlowPhases(a.lc, a.log, cfg.Expected))
	if a.history.path != "" {
		slow, err := metrics.NewSlowSteps(a.metrics)
		if err != nil {
			return nil, err
		}
		a.stops = append(a.stops, recordStart(a.lc, &a.history, slow))
	}

	onHTTP := checks.HTTP
	if f := cfg.OnHTTPCheck; f != nil {
		onHTTP = func(path string, code int) { checks.HTTP(path, code); f(path, code) }
	}
	a.checker = health.New(a.lc, health.Options{
		Version: cfg.Version, ServiceID: cfg.Name, Description: cfg.Description,
		OnHTTPCheck: onHTTP, Usual: a.history.usual(),
	})
	a.stops = append(a.stops, a.checker.Close)
	return checks, nil
}

// setupServer builds the port's server, on a socket handed over by a
// previous image when there is one, with health, the lifecycle's gate and
// gRPC traced and counted.
func (a *App) setupServer(checks *metrics.HealthChecks) error {
	cfg := a.cfg
	lis, err := a.listener()
	if err != nil {
		return err
	}
	if lis != nil {
		a.handedAddr = lis.Addr()
	}
	grpcOpts := append(a.callsOption(), grpc.ChainUnaryInterceptor(checks.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(checks.StreamServerInterceptor()))
	grpcOpts = append(grpcOpts, cfg.GRPCOptions...)
	sc := server.DefaultConfig()
	sc.Addr, sc.Listener = cfg.Listen, lis
	sc.DrainDelay, sc.StopTimeout = cfg.DrainDelay, cfg.StopTimeout
	sc.Health, sc.Gate = a.checker, server.LifecycleGate(a.lc)
	sc.TLS, sc.RequireClientCert = cfg.TLS, cfg.RequireClientCert
	sc.GRPCOptions = grpcOpts
	if cfg.Limits != nil {
		sc.Limits = *cfg.Limits
	}
	sc.Logger = a.log
	a.srv, err = server.New(sc)
	return err
}

// callsOption traces and measures the port's gRPC calls when the App
// exports spans (to its tracer and meter providers) or else metrics (to
// its meter and tracer providers): the instrumentation comes with the
// exporters, and with none the calls are neither traced nor measured.
func (a *App) callsOption() []grpc.ServerOption {
	o := a.ownTP.GRPCServerOption(a.metrics)
	if o == nil {
		o = a.metrics.GRPCServerOption(a.tracer)
	}
	if o == nil {
		return nil
	}
	return []grpc.ServerOption{o}
}

// setupNotifier tells systemd: STATUS, READY=1, STOPPING=1;
// EXTEND_TIMEOUT_USEC for the start's own budget (and what its rollback
// may take), never more; and WATCHDOG=1 only while the lifecycle answers
// and the port serves its own /livez.
func (a *App) setupNotifier() error {
	no := sdnotify.DefaultOptions()
	if a.cfg.StartTimeout > 0 {
		no.StartBudget = a.cfg.StartTimeout + a.stopBudget
	}
	no.Alive = a.srv.Alive
	no.OnAliveError = func(err error) { a.log.Error("liveness self-check failed: no WATCHDOG=1 sent", "error", err) }
	var err error
	if a.notifier, err = sdnotify.New(a.lc, no); err != nil {
		return err
	}
	a.stops = append(a.stops, a.notifier.Close)
	return nil
}

// setupRoutes serves the App's own pages on the port: metrics, the
// lifecycle's view, its events and the startup timeline.
func (a *App) setupRoutes() error {
	events := eventstream.NewHandler(a.lc)
	// A follower's stream would otherwise last until the lifecycle's
	// final event, after the port's drain, which would wait for it.
	a.srv.OnShutdown(events.Close)
	links := []timeline.Link{
		{Text: "/health", Href: "/health?pretty"},
		{Text: "/readyz?verbose", Href: "/readyz?verbose"},
		{Text: PathLifecycle, Href: PathLifecycle},
	}
	routes := map[string]http.Handler{
		"GET " + PathLifecycle: status.Handler(a.lc, a.history.usual()),
		"GET " + PathEvents:    events,
	}
	if h := a.metrics.Handler(); h != nil {
		routes["GET "+PathMetrics] = h
		links = append(links, timeline.Link{Text: PathMetrics, Href: PathMetrics})
	}
	routes["GET "+PathStartup] = timeline.Handler(a.lc, timeline.Options{Title: a.cfg.Name, Links: links, Usual: a.history.usual()})
	for pattern, h := range routes {
		if err := a.srv.Handle(pattern, h); err != nil {
			return err
		}
	}
	// A service's own route on one of these would shadow the App's page;
	// PathMetrics stays the App's even when no exporter serves it.
	// The rest of /debug/ stays open: the daemon serves /debug/slots.
	for _, p := range []string{PathMetrics, PathLifecycle, PathEvents, PathStartup} {
		a.srv.Reserve(p, "the App")
	}
	return nil
}
