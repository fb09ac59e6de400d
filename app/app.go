package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/health/sdnotify"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/server"
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

	addrCh      chan struct{} // closed once the port is bound
	logged      chan struct{} // closed once the logger saw the final event
	history     historyLog    // Config.History
	stopBudget  time.Duration // see StopBudget
	startBudget time.Duration // see StartBudget
	execPath    string        // the binary an upgrade executes
	handedAddr  net.Addr      // the address of a socket handed over, not bound by the App

	mu        sync.Mutex
	addr      net.Addr
	quit      chan struct{} // closed by Shutdown
	quitOnce  sync.Once
	closeOnce sync.Once
	loggedSeq uint64              // the Seq of the last event the log hook wrote
	logWake   chan struct{}       // closed at the hook's next event; nil while nobody waits
	upgrading bool                // draining for an in-place upgrade
	handover  map[string]*os.File // passed to the new image
	upgradeIn *upgradeInputs      // what SIGHUP checked, for the new image
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
	if err := a.setupHistory(phases); err != nil {
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
	a := &App{cfg: cfg, log: cfg.Logger, addrCh: make(chan struct{}), logged: make(chan struct{}), quit: make(chan struct{}),
		handover: map[string]*os.File{}}
	if a.log == nil {
		a.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var err error
	if a.inherit, err = inheritFiles(); err != nil {
		a.inherit.close()
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	cfg.ConfigFiles.logInherited(a.log)
	if cfg.UpgradeOnHangup {
		// The binary at this path now; an upgrade execs what is there
		// at its SIGHUP.
		if a.execPath, err = os.Executable(); err != nil {
			a.inherit.close()
			return nil, fmt.Errorf("%w: upgrade on SIGHUP: %w", ErrConfig, err)
		}
	}
	return a, nil
}

// StopBudget is the longest an orderly stop can take: the drain delay, the
// port's graceful stop, every phase's Stop in turn and the background
// tasks, each within its bound. [App.Run] enforces it; a supervisor's kill
// timeout (Nomad's kill_timeout, systemd's TimeoutStopSec, Kubernetes'
// terminationGracePeriodSeconds) must exceed it. Zero means unbounded
// (Config.StopTimeout is zero).
func (a *App) StopBudget() time.Duration { return a.stopBudget }

// StartBudget is the longest a start can take before it fails: each
// phase's worst case ([lifecycle.Phase.WorstCase]: every attempt timing
// out, every backoff at its longest) summed along the slowest chain of
// dependencies, since phases apart run in parallel, and never more than
// Config.StartTimeout. Zero means unbounded: a phase without a Timeout
// and no StartTimeout. A start that succeeds, or fails at once, takes
// less; a supervisor's start timeout (systemd's TimeoutStartSec, a
// Kubernetes startup probe's failureThreshold × periodSeconds) must
// exceed it.
func (a *App) StartBudget() time.Duration { return a.startBudget }

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

// SkipDrainDelay makes the next [App.Stop] drain the port without the
// drain delay: health still turns NOT_SERVING first, and in-flight calls
// still end gracefully within Config.StopTimeout, but nothing waits for
// checkers to notice. For a stop that knows no checker routes traffic
// here: phasetest's Harness calls it in every test unless the test asks
// for the delay (phasetest's Harness.KeepDrainDelay).
func (a *App) SkipDrainDelay() { a.srv.SkipDrainDelay() }

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
