package app

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/server"
	"github.com/phasegate/phasegate/tracing"
)

// PhaseListen is the name of the phase the App adds to bind its port. A
// phase that needs the port, or that binds services on it, depends on it.
const PhaseListen = "listen"

// Config configures an [App]. Durations mean what they say: a zero
// DrainDelay is no delay, a zero StopTimeout or StartTimeout no bound.
// [DefaultConfig] holds the recommended values.
type Config struct {
	// Name names the service: the /health body's serviceId, the timeline's
	// title and service.name of traces and metrics (unless
	// OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say otherwise).
	// Required.
	Name string
	// Version is reported by /health and in traces and metrics.
	Version string
	// Description is the /health body's description.
	Description string

	// Listen is the TCP address of the one port that serves gRPC and
	// HTTP, such as "127.0.0.1:7000" or ":7000". It is not used when the
	// process was handed a listening socket by systemd socket activation
	// (LISTEN_FDS) or Listener is set.
	Listen string
	// Listener, when set, is the port instead of binding Listen.
	Listener net.Listener
	// PortFrom, when set, gives the port's address and drain delay in
	// place of Listen and DrainDelay, so that a config phase is the one
	// place that reads them: the listen phase calls it once the phases
	// ListenAfter names have succeeded, and ListenAfter must name the one
	// that fills what it returns. MaxDrainDelay is the most the delay may
	// be. An error, an empty address or a delay out of bounds fails the
	// listen phase, and so the start, with an error that wraps
	// [ErrConfig].
	PortFrom func() (Port, error)
	// ListenAfter names phases the port waits for. Binding early is the
	// point, so usually none: a daemon that must hold a lock before it
	// answers names its lock phase here.
	ListenAfter []string
	// TLS secures the port (gRPC and HTTP alike); RequireClientCert makes
	// declared gRPC services accept only verified client certificates.
	TLS               *tls.Config
	RequireClientCert bool
	// GRPCOptions are added to the gRPC server's options, after the App's
	// own (the calls' spans and metrics when it exports either, the
	// health checks' metrics).
	GRPCOptions []grpc.ServerOption
	// Limits bound what the port's peers can take of it (connections in
	// total and per peer, message sizes, calls in flight); nil is
	// server.DefaultLimits(). A service that knows how many descriptors
	// its own work needs sets MaxConns from what is left.
	Limits *server.Limits
	// OnHTTPCheck, when set, is called after every answer of the HTTP
	// health endpoints, with the path and the status code, besides the
	// App's own metrics of them.
	OnHTTPCheck func(path string, code int)

	// StartTimeout bounds the whole start; zero means no bound.
	StartTimeout time.Duration
	// DrainDelay is the time between health turning NOT_SERVING and the
	// servers stopping: for checkers to notice and in-flight calls to end.
	// With PortFrom, the Port's DrainDelay is the delay instead.
	DrainDelay time.Duration
	// MaxDrainDelay is the most PortFrom's drain delay may be: the stop
	// budgets (of the phases, of [App.Run], told to systemd) are computed
	// from it in New, before PortFrom is asked. Zero means DrainDelay. It
	// needs PortFrom: without it, the delay is DrainDelay, known in New.
	MaxDrainDelay time.Duration
	// StopTimeout bounds the graceful stop of the servers after the delay,
	// and each phase's Stop that sets no StopTimeout; zero means no bound.
	StopTimeout time.Duration
	// Expected maps a phase to the time after which, still running, it is
	// logged as slow with its progress (and again each time that passes).
	Expected map[string]time.Duration
	// History, when set, is the file of the start history: each start's
	// phases and background tasks (how long, attempts, progress totals,
	// outcome) are kept there, the last HistorySize (20 when zero), and
	// /health, the timeline and the log show each step beside what it
	// usually takes, flagging one much slower than usual in the log and
	// in the metric phasegate.start.slow_steps. A missing or damaged file
	// starts a new history; it never stops a start. Empty: none kept.
	History     string
	HistorySize int
	// HistoryAfter, when set, names the phase after which the history's
	// file is read and written: a service whose History lives in a
	// directory a phase makes and checks (the daemon's lock phase checks
	// that only root controls its state directory) touches nothing there
	// before that phase succeeded, nor at all when it failed.
	HistoryAfter string

	// Logger receives the App's logs: every transition, slow phases,
	// signals. Nil discards them.
	Logger *slog.Logger
	// TracerProvider receives the spans of the phases, and of gRPC calls
	// when the App exports metrics. Nil builds one from the OTEL_*
	// environment (none unless OTEL_TRACES_EXPORTER says otherwise) and
	// flushes it at the end. A provider of one's own with no metric
	// exporter gets the calls' spans from
	// tracing/grpccalls.ServerOption in GRPCOptions.
	TracerProvider trace.TracerProvider
	// TraceExporters are the span exporters OTEL_TRACES_EXPORTER may name
	// when TracerProvider is nil: tracing/otlp's and tracing/console's
	// Exporter. A binary links only those given; one the environment asks
	// for but not given fails New, naming its package.
	TraceExporters []tracing.Exporter
	// MetricExporters are the metric exporters: metrics/prometheus's
	// Exporter makes the App serve [PathMetrics]; metrics/otlp's and
	// metrics/console's push where OTEL_METRICS_EXPORTER asks. Without
	// any the App's metrics are a no-op and [PathMetrics] is not served
	// (it stays reserved).
	MetricExporters []metrics.Exporter
	// LifecycleOptions are passed to lifecycle.New after the App's own.
	LifecycleOptions []lifecycle.Option

	// UpgradeOnHangup makes SIGHUP an in-place upgrade instead of a stop:
	// the App opens the binary at its path and checks it
	// (UpgradePreflight), turns NOT_SERVING and drains, keeping its
	// listening socket and what was registered with [App.HandOver] open,
	// and executes that binary (the file it checked, by its descriptor,
	// whatever the path holds by then) with the same arguments, as the
	// same process. Clients that connect
	// meanwhile wait in the socket's backlog. A binary or a configuration
	// file (ConfigFiles) that fails the check leaves the App serving, and
	// says why in the log; a binary whose exec fails is replaced by the
	// image that was running. A new image that fails its start anyway
	// exits, as any failed start does, and the port closes with it until
	// the supervisor starts the service again. A SIGHUP during an upgrade
	// or a start is refused, with a log line.
	UpgradeOnHangup bool
	// UpgradePreflight are the arguments the new binary is run with, as a
	// child process, before anything is stopped; it must exit 0. Empty
	// means only that the file must exist.
	UpgradePreflight []string
	// ConfigFiles, when set, is what the service read its configuration
	// files through ([InheritConfigFiles], [ConfigFiles.ReadFile]): at
	// SIGHUP each is read again with the service's own checks, before
	// anything is stopped (a file that fails refuses the upgrade, and the
	// App keeps serving), and the bytes read are handed to the check and
	// to the new image, which use them instead of reading the paths
	// again. New logs the files the previous image handed over.
	ConfigFiles *ConfigFiles
}

// Port is what a phase decides about the App's port: see Config.PortFrom.
type Port struct {
	// Listen is the TCP address to bind, as Config.Listen; like it, it
	// is not used when the process was handed a listening socket.
	Listen string
	// DrainDelay is the drain delay, as Config.DrainDelay: from zero to
	// Config.MaxDrainDelay.
	DrainDelay time.Duration
}

// DefaultConfig returns the recommended settings for a service called
// name listening on addr: a 10-minute start bound, a 5-second drain delay
// and a 10-second stop bound.
func DefaultConfig(name, addr string) Config {
	return Config{
		Name:         name,
		Listen:       addr,
		StartTimeout: 10 * time.Minute,
		DrainDelay:   5 * time.Second,
		StopTimeout:  10 * time.Second,
	}
}

// ErrConfig is wrapped by every error [New] returns for a bad Config or a
// bad phase graph.
var ErrConfig = errors.New("app: configuration")

func (c Config) validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...))
	}
	if c.Name == "" {
		bad("Name is required")
	}
	if c.Listen == "" && c.Listener == nil && c.PortFrom == nil {
		bad("Listen, Listener or PortFrom is required")
	}
	if c.PortFrom != nil && len(c.ListenAfter) == 0 {
		bad("PortFrom needs ListenAfter to name the phase that fills it: the listen phase would call it before any phase ran")
	}
	if c.MaxDrainDelay != 0 && c.PortFrom == nil {
		bad("MaxDrainDelay bounds the drain delay PortFrom gives, and PortFrom is not set: the drain delay is DrainDelay")
	}
	for name, d := range map[string]time.Duration{"StartTimeout": c.StartTimeout, "DrainDelay": c.DrainDelay, "MaxDrainDelay": c.MaxDrainDelay, "StopTimeout": c.StopTimeout} {
		if d < 0 {
			bad("%s is %v, must not be negative", name, d)
		}
	}
	return errors.Join(errs...)
}

// StopBudget is the longest an orderly stop of the port alone can take
// with these settings: the drain delay (with PortFrom, the most it may
// be), the graceful stop and, for handlers that ignore their cancelled
// context, one more stop timeout. Zero means unbounded (no StopTimeout).
// [App.StopBudget] adds the phases' stops.
func (c Config) StopBudget() time.Duration {
	if c.StopTimeout == 0 {
		return 0
	}
	return c.drainCeiling() + 2*c.StopTimeout
}

// drainCeiling is the longest the drain delay can be.
func (c Config) drainCeiling() time.Duration {
	if c.MaxDrainDelay > 0 {
		return c.MaxDrainDelay
	}
	return c.DrainDelay
}
