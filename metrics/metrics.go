package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/phasegate/phasegate/internal/otelenv"
)

// Exporter names accepted in OTEL_METRICS_EXPORTER, a comma-separated list.
//
// The in-process Prometheus registry that [Provider.Handler] serves
// (package metrics/prometheus) is there whenever it was given to [Setup],
// listed or not: "prometheus" names it and adds nothing. In
// particular it does not start a second HTTP server on
// OTEL_EXPORTER_PROMETHEUS_HOST:OTEL_EXPORTER_PROMETHEUS_PORT as contrib's
// autoexport would; those two variables are ignored, and /metrics is
// served wherever the daemon mounts the handler, on its own port. "otlp"
// and "console" add push exporters.
const (
	ExporterNone       = otelenv.None
	ExporterPrometheus = "prometheus"
	ExporterOTLP       = otelenv.OTLP
	ExporterConsole    = "console"
)

// Provider is a meter provider built by [Setup], the Prometheus registry it
// feeds and the means to flush it.
type Provider struct {
	metric.MeterProvider
	// Exporters lists OTEL_METRICS_EXPORTER as understood, in the order
	// given; empty for "none" or unset. The Prometheus registry is fed
	// whatever it lists, unless Disabled.
	Exporters []string
	// OTLP is true when metrics are also pushed over OTLP; Protocol is then
	// "grpc" or "http/protobuf".
	OTLP     bool
	Protocol string
	// Disabled is true when OTEL_SDK_DISABLED=true turned metrics off: the
	// meter provider is a no-op and the handler serves an empty registry.
	Disabled bool

	joined  Joined       // the zero Joined when no exporter is in use
	handler http.Handler // the pull exporter's; nil without one
}

// An Exporter is a metric exporter that OTEL_METRICS_EXPORTER can name. A
// binary holds only the exporters given to [Setup] by [WithExporters]:
// packages metrics/otlp, metrics/console and metrics/prometheus provide
// the three the specification names, and package metrics/export makes
// one of any OpenTelemetry SDK exporter or reader. The SDK comes with
// them: this package names no SDK type, so that a service exporting no
// metric links neither the SDK nor the Prometheus client.
type Exporter struct {
	// Name is the exporter's name in OTEL_METRICS_EXPORTER, lower case.
	Name string
	// Always makes Setup use the exporter whether or not the environment
	// lists it (the Prometheus registry that /metrics serves, which costs
	// nothing until scraped).
	Always bool
	// Open opens the exporter; Setup calls it when the environment names
	// it (or Always). It must not dial: a collector that is down must not
	// delay the start.
	Open func(ctx context.Context, s ExportSettings) (Pipeline, error)
}

// ExportSettings is what [Setup] hands an [Exporter]'s Open.
type ExportSettings struct {
	// Protocol is the OTLP protocol the environment asks for, "grpc" or
	// "http/protobuf"; empty unless OTEL_METRICS_EXPORTER lists "otlp".
	Protocol string
	// Console is where a console exporter writes ([WithConsoleWriter]).
	Console io.Writer
	// Disabled is true under OTEL_SDK_DISABLED=true: Open is then called
	// only for an Always exporter, for its Handler (which serves nothing),
	// and the pipeline is not joined.
	Disabled bool
	// ServiceName and Version are the service's, as given to Setup: the
	// resource's defaults, which the environment overrides.
	ServiceName, Version string
}

// A Pipeline is an opened [Exporter]: for package metrics/export, an SDK
// reader (a periodic one for a push exporter).
type Pipeline interface {
	// Handler serves a pull exporter's scrape ([Provider.Handler]); nil
	// for a push exporter.
	Handler() http.Handler
	// Join builds the meter provider that every pipeline of all reads:
	// those Setup opened, the receiver first. A pipeline may refuse to
	// join one another package opened.
	Join(ctx context.Context, all []Pipeline) (Joined, error)
	// Shutdown stops the exporter of a pipeline that was opened but not
	// joined, because another failed.
	Shutdown(ctx context.Context) error
}

// Joined is the meter provider a [Pipeline] built, with what Setup's
// [Provider] needs of it.
type Joined struct {
	metric.MeterProvider
	// Shutdown flushes the push exporters and stops every joined one; a
	// second call returns nil.
	Shutdown func(ctx context.Context) error
	// ServerOption measures a gRPC server's calls on the provider and
	// traces them to tp ([Provider.GRPCServerOption]).
	ServerOption func(tp trace.TracerProvider) grpc.ServerOption
}

// WithExporters gives Setup the exporters OTEL_METRICS_EXPORTER may name.
// A name the specification knows ("otlp", "console", "prometheus") that is
// not given is an error when the environment asks for it, naming the
// package that provides it; a later exporter of the same name replaces an
// earlier one.
func WithExporters(e ...Exporter) Option {
	return Option(otelenv.WithExporters(e))
}

// An Option adjusts [Setup].
type Option func(*config)

// config is what the options set.
type config = otelenv.Settings[Exporter]

// WithServiceName sets service.name when OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES do not. The default is "phasegate".
func WithServiceName(name string) Option { return Option(otelenv.WithServiceName[Exporter](name)) }

// WithVersion sets service.version.
func WithVersion(v string) Option { return Option(otelenv.WithVersion[Exporter](v)) }

// WithConsoleWriter sets where the console exporter writes; stderr by default.
func WithConsoleWriter(w io.Writer) Option { return Option(otelenv.WithConsoleWriter[Exporter](w)) }

// Setup returns a meter provider configured from the environment.
//
// OTEL_SDK_DISABLED=true returns a no-op provider whose handler serves an
// empty registry, and reads nothing else. Otherwise the provider holds
// every instrument for the exporters given by [WithExporters] that the
// environment asks for, and for those that are Always there (the
// Prometheus registry that [Provider.Handler] serves, with the Go runtime
// and process collectors). OTEL_METRICS_EXPORTER, a comma-separated list
// of "otlp", "console", "prometheus" or "none", adds push exporters: each
// pushes every OTEL_METRIC_EXPORT_INTERVAL (default 60s). "otlp" pushes to
// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, with
// the protocol in OTEL_EXPORTER_OTLP_METRICS_PROTOCOL or
// OTEL_EXPORTER_OTLP_PROTOCOL (default http/protobuf), and makes no
// connection before its first push; "console" writes JSON to the console
// writer. An unknown exporter or protocol is an error, so that a typo does
// not silently drop metrics; so is one that was not given. With no
// exporter and no reader the provider is a no-op.
func Setup(ctx context.Context, opts ...Option) (*Provider, error) {
	c := otelenv.Apply(opts)
	given, linked := c.Given(func(e Exporter) string { return e.Name })
	disabled, err := otelenv.Disabled()
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if disabled {
		return disabledProvider(ctx, given, c.Console)
	}
	p := &Provider{}
	signal := otelenv.Signal{Name: "METRICS", Package: "metrics", Field: "MetricExporters"}
	if p.Exporters, p.Protocol, err = signal.Choose([]string{ExporterOTLP, ExporterConsole, ExporterPrometheus}, linked); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	p.OTLP = slices.Contains(p.Exporters, ExporterOTLP)
	settings := ExportSettings{Protocol: p.Protocol, Console: c.Console, ServiceName: c.ServiceName, Version: c.Version}
	opened, err := otelenv.Open(ctx, chosen(given, p.Exporters), func(name string) (Pipeline, error) { return given[name].Open(ctx, settings) })
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if len(opened) == 0 {
		p.MeterProvider = metricnoop.NewMeterProvider()
		return p, nil
	}
	if p.joined, err = opened[0].Join(ctx, opened); err != nil {
		return nil, fmt.Errorf("metrics: %w", otelenv.Shutdown(ctx, opened, err))
	}
	p.MeterProvider = p.joined.MeterProvider
	for _, o := range opened {
		if h := o.Handler(); h != nil {
			p.handler = h
		}
	}
	return p, nil
}

// chosen names the exporters to open: those Always there, then those the
// environment names, each once.
func chosen(given map[string]Exporter, names []string) []string {
	var use []string
	for _, e := range given {
		if e.Always {
			use = append(use, e.Name)
		}
	}
	slices.Sort(use)
	for _, name := range names {
		if !slices.Contains(use, name) {
			use = append(use, name)
		}
	}
	return use
}

// disabledProvider is Setup under OTEL_SDK_DISABLED=true: a no-op provider
// whose handler, when a pull exporter was given, serves nothing.
func disabledProvider(ctx context.Context, given map[string]Exporter, console io.Writer) (*Provider, error) {
	p := &Provider{MeterProvider: metricnoop.NewMeterProvider(), Disabled: true}
	for _, e := range given {
		if !e.Always {
			continue
		}
		o, err := e.Open(ctx, ExportSettings{Console: console, Disabled: true})
		if err != nil {
			return nil, fmt.Errorf("metrics: %s exporter: %w", e.Name, err)
		}
		if h := o.Handler(); h != nil {
			p.handler = h
		}
	}
	return p, nil
}

// Handler serves the scrape of the pull exporter given to [Setup] (the
// Prometheus text exposition of every metric, with metrics/prometheus);
// when Disabled, an empty one (200, no samples), so that a scraper sees
// the daemon up rather than a broken target. It is nil when no pull
// exporter was given.
func (p *Provider) Handler() http.Handler { return p.handler }

// Shutdown pushes what is left to the push exporters (otlp, console) and
// stops the provider. It is safe to call more than once, and on a disabled
// provider.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.joined.Shutdown == nil {
		return nil
	}
	if err := p.joined.Shutdown(ctx); err != nil {
		return fmt.Errorf("metrics: shutdown: %w", err)
	}
	return nil
}

// GRPCServerOption measures a gRPC server's calls on p (the rpc.server.*
// metrics), and traces them to tp (package tracing/grpccalls). It is nil
// when no metric is exported: the calls' instrumentation comes with the
// exporters, so that a service exporting nothing neither links otelgrpc
// nor pays for it on each call. p may be nil.
func (p *Provider) GRPCServerOption(tp trace.TracerProvider) grpc.ServerOption {
	if p == nil || p.joined.ServerOption == nil {
		return nil
	}
	return p.joined.ServerOption(tp)
}
