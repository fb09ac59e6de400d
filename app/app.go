package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/phasegate/phasegate/eventstream"
	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/health/sdnotify"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/server"
	"github.com/phasegate/phasegate/timeline"
	"github.com/phasegate/phasegate/tracing"
)

// PhaseServe is the name of the phase the App adds after every other one.
// Its success is the lifecycle turning serving (health SERVING, READY=1,
// declared services dispatched); its stop drains the port first of all, so
// the port stops taking work before any phase is undone.
const PhaseServe = "serve"

// HTTP paths the App serves besides the health endpoints.
const (
	// PathMetrics serves every metric in the Prometheus text format when
	// Config.MetricExporters holds metrics/prometheus's Exporter.
	PathMetrics = "/metrics"
	// PathStartup serves the start as a timeline (HTML, SVG, no script).
	PathStartup = "/debug/startup"
	// PathLifecycle serves the lifecycle as JSON ([View]); `phasegate
	// status --addr` reads it.
	PathLifecycle = "/debug/lifecycle"
	// PathEvents serves every transition of the lifecycle, in order, as a
	// resumable Server-Sent Events stream (package eventstream); a test
	// asserts phase order against a running process with it (package
	// phasetest).
	PathEvents = "/debug/events"
)

// App runs a service whose startup is a lifecycle of phases, on one port
// for gRPC and HTTP, with health in every dialect (grpc.health.v1, HTTP for
// Nomad, Consul and Kubernetes, systemd's sd_notify), a span per phase,
// metrics, and signals. Create it with [New], declare what the port serves
// on [App.Server], then [App.Run] it (or [App.Start] and [App.Stop] it from
// a test).
type App struct {
	cfg      Config
	log      *slog.Logger
	lc       *lifecycle.Lifecycle
	srv      *server.Server
	checker  *health.Checker
	notifier *sdnotify.Notifier
	metrics  *metrics.Provider
	tracer   trace.TracerProvider
	ownTP    *tracing.Provider // built by New from the environment; flushed at the end
	inherit  *inherited
	stops    []func() // observers, stopped in reverse at close

	addrCh     chan struct{} // closed once the port is bound
	logged     chan struct{} // closed once the logger saw the final event
	stopBudget time.Duration // see StopBudget
	execPath   string        // the binary an upgrade executes
	handedAddr net.Addr      // the address of a socket handed over, not bound by the App

	mu        sync.Mutex
	addr      net.Addr
	quit      chan struct{} // closed by Shutdown
	quitOnce  sync.Once
	closeOnce sync.Once
	loggedSeq uint64              // the Seq of the last event the log hook wrote
	logWake   chan struct{}       // closed at the hook's next event; nil while nobody waits
	upgrading bool                // draining for an in-place upgrade
	handover  map[string]*os.File // passed to the new image
}

// New checks cfg and the phases and returns an App that has run no phase
// and bound no port (its listen phase binds it), but is not inert: New
// takes the sockets the process was handed (LISTEN_FDS, an upgrade's),
// builds the tracer and meter providers (with the exporters the OTEL_*
// environment asks for) and starts the goroutines that observe the
// lifecycle: the health checker, the systemd notifier (and its watchdog
// under WATCHDOG_USEC), the lifecycle's metrics and the slow-phase
// warnings. A caller that gives up after New, because a Declare or a
// DeclareHTTP failed, must call [App.Stop] to end them; [App.Run] and
// [App.Main] do it themselves. It adds two phases to yours: [PhaseListen] (depending on cfg.ListenAfter) and [PhaseServe]
// (depending on every phase nothing else depends on). Every error wraps
// [ErrConfig]; a phase named like one of those is a [*ReservedPhaseError],
// one that depends on serve a [*ServeDependencyError].
func New(cfg Config, phases ...lifecycle.Phase) (*App, error) {
	a, err := newApp(cfg)
	if err != nil {
		return nil, err
	}
	if err := a.build(phases); err != nil {
		a.close() // what the steps before the failed one built
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return a, nil
}

// build runs New's steps in order, each on what the ones before it built.
func (a *App) build(phases []lifecycle.Phase) error {
	if err := a.setupTracer(); err != nil {
		return err
	}
	if err := a.setupLifecycle(phases); err != nil {
		return err
	}
	checks, err := a.setupObservers()
	if err != nil {
		return err
	}
	if err := a.setupServer(checks); err != nil {
		return err
	}
	if err := a.setupNotifier(); err != nil {
		return err
	}
	return a.setupRoutes()
}

// newApp checks cfg and takes what the process was handed: the sockets of
// a previous image, and the path an upgrade will execute.
func newApp(cfg Config) (*App, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	a := &App{cfg: cfg, log: cfg.Logger, addrCh: make(chan struct{}), logged: make(chan struct{}), quit: make(chan struct{})}
	if a.log == nil {
		a.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var err error
	if a.inherit, err = inheritFiles(); err != nil {
		a.inherit.close()
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cfg.UpgradeOnHangup {
		// The binary at this path now; an upgrade execs what is there then.
		if a.execPath, err = os.Executable(); err != nil {
			a.inherit.close()
			return nil, fmt.Errorf("%w: upgrade on SIGHUP: %w", ErrConfig, err)
		}
	}
	return a, nil
}

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

	onHTTP := checks.HTTP
	if f := cfg.OnHTTPCheck; f != nil {
		onHTTP = func(path string, code int) { checks.HTTP(path, code); f(path, code) }
	}
	a.checker = health.New(a.lc, health.Options{
		Version: cfg.Version, ServiceID: cfg.Name, Description: cfg.Description,
		OnHTTPCheck: onHTTP,
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
	grpcOpts := append([]grpc.ServerOption{
		tracing.GRPCServerOption(a.tracer, a.metrics),
		grpc.ChainUnaryInterceptor(checks.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(checks.StreamServerInterceptor()),
	}, cfg.GRPCOptions...)
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
		"GET " + PathLifecycle: viewHandler(a.lc),
		"GET " + PathEvents:    events,
	}
	if h := a.metrics.Handler(); h != nil {
		routes["GET "+PathMetrics] = h
		links = append(links, timeline.Link{Text: PathMetrics, Href: PathMetrics})
	}
	routes["GET "+PathStartup] = timeline.Handler(a.lc, timeline.Options{Title: a.cfg.Name, Links: links})
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

// graph returns the phases with the App's own: listen, after ListenAfter,
// and serve, after every phase that nothing depends on.
func (a *App) graph(phases []lifecycle.Phase) []lifecycle.Phase {
	depended := map[string]bool{}
	for _, p := range phases {
		for _, d := range p.DependsOn {
			depended[d] = true
		}
	}
	serveAfter := []string{PhaseListen}
	for _, p := range phases {
		if !depended[p.Name] && p.Name != PhaseListen {
			serveAfter = append(serveAfter, p.Name)
		}
	}
	budget := a.cfg.StopBudget()
	// The listen phase's stop drains the port when the start fails before
	// serve; after serve, serve's stop has done it already.
	listen := lifecycle.Phase{Name: PhaseListen, DependsOn: a.cfg.ListenAfter, Run: a.runListen, Stop: a.stopServer, StopTimeout: budget}
	// Declared right after the phases it waits for, so that views that
	// list phases in declaration order read in the order things happen.
	at := 0
	for i, p := range phases {
		if slices.Contains(a.cfg.ListenAfter, p.Name) {
			at = i + 1
		}
	}
	out := slices.Insert(slices.Clone(phases), at, listen)
	return append(out, lifecycle.Phase{Name: PhaseServe, DependsOn: serveAfter, Run: runServe, Stop: a.stopServer, StopTimeout: budget})
}

func (a *App) runListen(ctx context.Context, _ *lifecycle.Progress) error {
	listen, err := a.resolvePort()
	if err != nil {
		return lifecycle.Permanent(err)
	}
	if err := a.srv.Serve(ctx); err != nil {
		return lifecycle.Permanent(fmt.Errorf("listen on %s: %w", listen, err))
	}
	a.mu.Lock()
	a.addr = a.srv.Addr()
	a.mu.Unlock()
	close(a.addrCh)
	if err := reportAddr(a.addr); err != nil {
		_ = a.stopServer(ctx) // at once: it never served
		return lifecycle.Permanent(err)
	}
	a.logCaughtUp() // after "phase started phase=listen"
	a.log.Info("listening", "addr", a.addr.String(), "tls", a.cfg.TLS != nil)
	return nil
}

// resolvePort asks Config.PortFrom, when set, for the address and the
// drain delay a phase decided, checks them and gives them to the server;
// it returns the address to bind.
func (a *App) resolvePort() (string, error) {
	if a.cfg.PortFrom == nil {
		return a.cfg.Listen, nil
	}
	p, err := a.cfg.PortFrom()
	if err != nil {
		return "", fmt.Errorf("%w: PortFrom: %w", ErrConfig, err)
	}
	if p.Listen == "" && a.handedAddr == nil {
		return "", fmt.Errorf("%w: PortFrom gave no address to listen on (did a phase of ListenAfter %q fill it?)", ErrConfig, a.cfg.ListenAfter)
	}
	if p.DrainDelay < 0 || p.DrainDelay > a.cfg.DrainDelay {
		return "", fmt.Errorf("%w: PortFrom gave a drain delay of %v: want 0 to Config.DrainDelay, %v, from which the stop budgets were computed",
			ErrConfig, p.DrainDelay, a.cfg.DrainDelay)
	}
	if err := a.srv.SetPort(p.Listen, p.DrainDelay); err != nil {
		return "", fmt.Errorf("PortFrom: %w", err)
	}
	return p.Listen, nil
}

// runServe has nothing left to do: the lifecycle turns serving when it
// returns, which opens the gate for application calls, turns health
// SERVING and sends READY=1.
func runServe(context.Context, *lifecycle.Progress) error { return nil }

// stopServer drains the port: the stop of listen and of serve, whichever
// runs first. A lifecycle that never served never opened the gate, so no
// checker can have routed traffic to the port and no application call is
// in flight: the drain delay is skipped, and a start that fails or is
// drained before serving ends in milliseconds.
func (a *App) stopServer(ctx context.Context) error {
	if !a.everServed() {
		a.srv.SkipDrainDelay()
	}
	return a.srv.Drain(ctx)
}

// everServed reports whether the lifecycle ever turned serving.
func (a *App) everServed() bool {
	for _, t := range a.lc.Snapshot().History {
		if t.State == lifecycle.StateServing {
			return true
		}
	}
	return false
}

// stopBudget is the longest the stops can take: they run one after the
// other, each within its own bound (the phase's StopTimeout, else
// Config.StopTimeout); the port's drain, a stop of both listen and serve,
// runs once; and background tasks get one more StopTimeout to return. Zero
// when any stop is unbounded.
func stopBudget(graph []lifecycle.Phase, cfg Config) time.Duration {
	if cfg.StopTimeout == 0 {
		return 0
	}
	total := cfg.StopBudget() + cfg.StopTimeout // the port, once; the tasks
	for _, p := range graph {
		if p.Stop == nil || p.Name == PhaseListen || p.Name == PhaseServe {
			continue
		}
		d := p.StopTimeout
		if d == 0 {
			d = cfg.StopTimeout
		}
		total += d
	}
	return total
}

// StopBudget is the longest an orderly stop can take: the drain delay, the
// port's graceful stop, every phase's Stop in turn and the background
// tasks, each within its bound. [App.Run] enforces it; a supervisor's kill
// timeout (Nomad's kill_timeout, systemd's TimeoutStopSec, Kubernetes'
// terminationGracePeriodSeconds) must exceed it. Zero means unbounded
// (Config.StopTimeout is zero).
func (a *App) StopBudget() time.Duration { return a.stopBudget }

// HandedAddr returns the address of the listening socket the App was
// handed (Config.Listener, systemd socket activation, an upgrade's earlier
// image), or nil when it binds Config.Listen itself. The handed socket is
// the one served, whatever Config.Listen says: a caller that judges the
// address (is it loopback?) must judge this one.
func (a *App) HandedAddr() net.Addr { return a.handedAddr }

// Server returns the server of the port: declare gRPC services and gated
// HTTP routes on it before the App starts, bind them from the phases that
// make them ready, add HTTP handlers at any time.
func (a *App) Server() *server.Server { return a.srv }

// Lifecycle returns the lifecycle that runs the phases.
func (a *App) Lifecycle() *lifecycle.Lifecycle { return a.lc }

// MeterProvider returns the meter provider whose metrics the exporters of
// Config.MetricExporters export (/metrics, OTLP pushes); a no-op without
// any.
func (a *App) MeterProvider() metric.MeterProvider { return a.metrics }

// TracerProvider returns the tracer provider the phases' spans go to.
func (a *App) TracerProvider() trace.TracerProvider { return a.tracer }

// Logger returns the App's logger.
func (a *App) Logger() *slog.Logger { return a.log }

// Addr waits until the port is bound and returns its address, or nil when
// ctx ends first.
func (a *App) Addr(ctx context.Context) net.Addr {
	select {
	case <-a.addrCh:
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.addr
	case <-ctx.Done():
		return nil
	}
}

// Start runs the phases and returns once the App serves, or the start
// failed (the phases that had succeeded are then stopped already). A
// start that did not finish within Config.StartTimeout fails with a
// *lifecycle.StartTimeoutError naming the phases still running and how far
// they got. Call [App.Stop] in either case.
func (a *App) Start(ctx context.Context) error { return a.lc.Start(ctx) }

// Stop drains the App: the port first (health NOT_SERVING, the drain
// delay, a graceful stop), then the phases' Stop functions in reverse
// order, then the observers. Ending ctx cuts the waits short. It returns
// the stops' errors, joined; calling it again returns the first result.
func (a *App) Stop(ctx context.Context) error {
	err := a.lc.Drain(ctx)
	a.close()
	return err
}

// Shutdown asks a running [App.Run] for an orderly stop, as a SIGTERM
// would. It does not wait; calling it again does nothing.
func (a *App) Shutdown() {
	a.quitOnce.Do(func() { close(a.quit) })
}

// close stops the observers and flushes telemetry; idempotent.
func (a *App) close() {
	a.closeOnce.Do(func() {
		for i := len(a.stops) - 1; i >= 0; i-- {
			a.stops[i]()
		}
		// The log's last lines: the hook may still be catching up with
		// the drain.
		if s := a.lc; s != nil && s.State() == lifecycle.StateStopped {
			select {
			case <-a.logged:
			case <-time.After(2 * time.Second):
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if a.metrics != nil {
			if err := a.metrics.Shutdown(ctx); err != nil {
				a.log.Warn("flushing metrics", "error", err)
			}
		}
		if a.ownTP != nil {
			if err := a.ownTP.Shutdown(ctx); err != nil {
				a.log.Warn("flushing traces", "error", err)
			}
		}
		a.inherit.close()
	})
}

// Run starts the App and blocks until it is told to stop, then stops it:
//
//   - SIGINT, SIGTERM or SIGHUP, or [App.Shutdown], or ctx ending: an
//     orderly drain; Run returns nil when it completes;
//   - the same during the start: the start is cut short and drained, in
//     milliseconds when the App never served (no drain delay is spent on
//     a port that never served); the log reads "draining during startup"
//     with the signal or reason, the lifecycle turning draining from
//     starting, each phase that was running ending cancelled, at INFO,
//     with reason "lifecycle: drained during the start" (an orderly stop,
//     not an error), each pending one skipped, the stops of the phases
//     that had succeeded, then "stopped"; Run returns nil;
//   - a second signal during the drain: the waits are cut short, and so
//     they are when the drain outlasts [App.StopBudget];
//   - a start that fails: Run returns its error after the rollback;
//   - a failure after serving (the port's listener dies, or
//     [lifecycle.Lifecycle.Fail]): the lifecycle turns failed, health says
//     so, the App drains and Run returns the cause, so that the process
//     exits non-zero and its supervisor restarts it.
func (a *App) Run(ctx context.Context) error {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	return a.run(ctx, sigs)
}

// Main runs the App on the process's signals and returns the exit code,
// which is 0 or 1 and nothing else: 0 after an orderly stop (a signal,
// [App.Shutdown], a drain during the start included), 1 after a failure
// (a start that failed or timed out, a failure after serving, a drain that
// failed or was cut short, an upgrade whose exec failed), logged as
// "exiting after a failure". A successful upgrade does not return: the
// process is the new image. An error from [New] happens before Main; its
// exit code is the program's choice (the examples exit 2).
func (a *App) Main() int {
	if err := a.Run(context.Background()); err != nil {
		a.log.Error("exiting after a failure", "error", err)
		return 1
	}
	return 0
}

func (a *App) run(ctx context.Context, sigs <-chan os.Signal) error {
	defer a.close()
	started := make(chan error, 1)
	go func() { started <- a.Start(ctx) }()
	cause, startReturned := a.untilStop(ctx, sigs, started)
	upgrade := errors.Is(cause, errUpgrade)
	if upgrade {
		cause = nil
		a.mu.Lock()
		a.upgrading = true
		a.mu.Unlock()
	}
	drainErr, interrupted := a.drain(ctx, sigs)
	if !startReturned {
		<-started // returns at once: Drain waited for the start to end
	}
	if drainErr != nil {
		attrs := []any{"error", drainErr}
		if stack := PanicStack(drainErr); stack != "" {
			attrs = append(attrs, "stack", stack)
		}
		a.log.Error("drain", attrs...)
	}
	if upgrade && interrupted == nil {
		// The drain's errors do not stop an upgrade: what the new image
		// needs is durable, and it reclaims whatever was left.
		a.close()
		return a.execUpgrade(a.execPath)
	}
	if upgrade {
		a.log.Warn("upgrade abandoned: the drain was cut short", "cause", interrupted.Error())
	}
	if cause == nil && drainErr != nil {
		cause = fmt.Errorf("drain: %w", drainErr)
	}
	if cause == nil {
		a.logCaughtUp()
		a.log.Info("stopped")
	}
	return cause
}

// untilStop waits through the start (started is its outcome) and then,
// once serving, for a reason to stop: a signal, Shutdown, ctx's end, or
// a failure, which it returns as cause ([errUpgrade] for an upgrade).
// startReturned says whether the start had ended.
func (a *App) untilStop(ctx context.Context, sigs <-chan os.Signal, started <-chan error) (cause error, startReturned bool) {
	for {
		select {
		case err := <-started:
			a.logCaughtUp()
			if err != nil {
				a.log.Error("startup failed", "error", err)
				return err, true
			}
			a.log.Info("serving", "addr", addrString(a.Addr(ctx)), "startup", time.Since(a.lc.Snapshot().Started).Round(time.Millisecond).String())
			return a.serving(ctx, sigs), true
		case sig := <-sigs:
			a.logCaughtUp() // the signal came after what was logged so far
			if sig == syscall.SIGHUP && a.cfg.UpgradeOnHangup {
				a.log.Warn("SIGHUP during the start: upgrade refused; send it again once serving")
				continue
			}
			a.log.Info("draining during startup", "signal", sig.String())
			return nil, false
		case <-a.quit:
			a.logCaughtUp()
			a.log.Info("draining during startup", "reason", "shutdown requested")
			return nil, false
		case <-ctx.Done():
			a.logCaughtUp()
			a.log.Info("draining during startup", "reason", context.Cause(ctx).Error())
			return nil, false
		}
	}
}

// drain drains the lifecycle within the stop budget; a second signal cuts
// it short: every wait of the stop functions sees its context end. It
// returns the drain's error and, when it was cut short, why.
func (a *App) drain(ctx context.Context, sigs <-chan os.Signal) (drainErr, interrupted error) {
	drainCtx, cutShort := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cutShort(nil)
	if a.stopBudget > 0 {
		var cancel context.CancelFunc
		drainCtx, cancel = context.WithTimeoutCause(drainCtx, a.stopBudget,
			fmt.Errorf("stop budget of %v spent", a.stopBudget))
		defer cancel()
	}
	go func() {
		for {
			select {
			case sig := <-sigs:
				if sig == syscall.SIGHUP && a.cfg.UpgradeOnHangup {
					a.log.Warn("SIGHUP during a drain or an upgrade: refused")
					continue
				}
				a.log.Warn("second signal: stopping now", "signal", sig.String())
				cutShort(fmt.Errorf("second signal %s", sig))
				return
			case <-drainCtx.Done():
				return
			}
		}
	}()
	drainErr = a.lc.Drain(drainCtx)
	interrupted = context.Cause(drainCtx)
	cutShort(nil)
	return drainErr, interrupted
}

// serving waits, while the App serves, for a reason to stop, and returns
// the failure when that reason is one ([errUpgrade] for an upgrade).
func (a *App) serving(ctx context.Context, sigs <-chan os.Signal) error {
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGHUP && a.cfg.UpgradeOnHangup {
				if err := a.preflight(ctx, a.execPath); err != nil {
					a.log.Error("SIGHUP: upgrade refused, the new binary failed its check; still serving", "binary", a.execPath, "error", err)
					continue
				}
				// The port's socket, kept open across the drain: its
				// backlog holds the connections that arrive meanwhile.
				f, err := a.srv.ListenerFile()
				if err != nil {
					a.log.Error("SIGHUP: upgrade refused; still serving", "error", err)
					continue
				}
				a.HandOver(ListenFDName, f)
				a.srv.DrainForHandover()
				a.log.Info("SIGHUP: upgrading in place", "binary", a.execPath)
				return errUpgrade
			}
			a.log.Info("draining", "signal", sig.String())
			return nil
		case <-a.quit:
			a.log.Info("draining", "reason", "shutdown requested")
			return nil
		case <-ctx.Done():
			a.log.Info("draining", "reason", context.Cause(ctx).Error())
			return nil
		case <-a.srv.Done():
			err := a.srv.Err()
			if err == nil {
				err = errors.New("the server stopped serving")
			}
			if ferr := a.lc.Fail(err); ferr != nil {
				a.log.Warn("marking the lifecycle failed", "error", ferr)
			}
			a.log.Error("failure after serving: draining", "error", err)
			return err
		case <-a.lc.Done(): // serving ends here only by a failure
			err := a.lc.Err()
			if err == nil {
				err = errors.New("lifecycle failed")
			}
			a.log.Error("failure after serving: draining", "error", err)
			return err
		}
	}
}

// logCaughtUp waits until the log hook has written every lifecycle event
// recorded so far, so that the App's own line about an outcome ("serving",
// "startup failed", "stopped") comes after the phase and lifecycle lines
// that led to it: the hook runs on its own goroutine, behind. A log writer
// that blocks does not hold the App up for more than a bound.
func (a *App) logCaughtUp() {
	want := a.lc.Snapshot().EventSeq
	bound := time.NewTimer(2 * time.Second)
	defer bound.Stop()
	for {
		a.mu.Lock()
		if a.loggedSeq >= want {
			a.mu.Unlock()
			return
		}
		if a.logWake == nil {
			a.logWake = make(chan struct{})
		}
		wake := a.logWake
		a.mu.Unlock()
		select {
		case <-wake:
		case <-bound.C:
			return
		}
	}
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}
