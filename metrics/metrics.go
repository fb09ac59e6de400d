package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

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
	ExporterOTLP       = "otlp"
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

	sdk     *sdkmetric.MeterProvider
	handler http.Handler // the pull exporter's; nil without one
}

// An Exporter is a metric exporter that OTEL_METRICS_EXPORTER can name. A
// binary holds only the exporters given to [Setup] by [WithExporters]:
// packages metrics/otlp, metrics/console and metrics/prometheus provide
// the three the specification names, so a service that exports no metric
// links none of them (nor the Prometheus client).
type Exporter struct {
	// Name is the exporter's name in OTEL_METRICS_EXPORTER, lower case.
	Name string
	// Always makes Setup use the exporter whether or not the environment
	// lists it (the Prometheus registry that /metrics serves, which costs
	// nothing until scraped).
	Always bool
	// New builds the exporter; Setup calls it when the environment names
	// it (or Always). It must not dial: a collector that is down must not
	// delay the start.
	New func(ctx context.Context, s ExportSettings) (Export, error)
}

// ExportSettings is what [Setup] hands an [Exporter]'s New.
type ExportSettings struct {
	// Protocol is the OTLP protocol the environment asks for, "grpc" or
	// "http/protobuf"; empty unless OTEL_METRICS_EXPORTER lists "otlp".
	Protocol string
	// Console is where a console exporter writes ([WithConsoleWriter]).
	Console io.Writer
	// Disabled is true under OTEL_SDK_DISABLED=true: New is then called
	// only for an Always exporter, for its Handler (which serves nothing),
	// and its Reader is not used.
	Disabled bool
}

// Export is what an [Exporter] adds to the provider.
type Export struct {
	// Reader is added to the meter provider: a periodic reader for a push
	// exporter, the exporter itself for a pull one.
	Reader sdkmetric.Reader
	// Handler serves a pull exporter's scrape ([Provider.Handler]); nil
	// for a push exporter.
	Handler http.Handler
}

// WithExporters gives Setup the exporters OTEL_METRICS_EXPORTER may name.
// A name the specification knows ("otlp", "console", "prometheus") that is
// not given is an error when the environment asks for it, naming the
// package that provides it; a later exporter of the same name replaces an
// earlier one.
func WithExporters(e ...Exporter) Option {
	return func(c *config) { c.exporters = append(c.exporters, e...) }
}

// An Option adjusts [Setup].
type Option func(*config)

type config struct {
	serviceName string
	version     string
	console     io.Writer
	readers     []sdkmetric.Reader
	exporters   []Exporter
}

// WithServiceName sets service.name when OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES do not. The default is "phasegate".
func WithServiceName(name string) Option { return func(c *config) { c.serviceName = name } }

// WithVersion sets service.version.
func WithVersion(v string) Option { return func(c *config) { c.version = v } }

// WithConsoleWriter sets where the console exporter writes; stderr by default.
func WithConsoleWriter(w io.Writer) Option { return func(c *config) { c.console = w } }

// WithReader adds a reader, such as an sdkmetric.ManualReader in tests. It
// is unused when OTEL_SDK_DISABLED=true.
func WithReader(r sdkmetric.Reader) Option {
	return func(c *config) { c.readers = append(c.readers, r) }
}

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
	c := config{serviceName: "phasegate", console: os.Stderr}
	for _, o := range opts {
		o(&c)
	}
	given := map[string]Exporter{}
	known := []string{ExporterOTLP, ExporterConsole, ExporterPrometheus}
	for _, e := range c.exporters {
		given[e.Name] = e
		known = append(known, e.Name)
	}
	disabled, err := otelenv.Disabled()
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if disabled {
		return disabledProvider(ctx, given, c.console)
	}
	p := &Provider{}
	if p.Exporters, err = otelenv.Exporters("OTEL_METRICS_EXPORTER", known...); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if p.OTLP = slices.Contains(p.Exporters, ExporterOTLP); p.OTLP {
		if p.Protocol, err = otelenv.Protocol("METRICS"); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	use, err := chosen(given, p.Exporters)
	if err != nil {
		return nil, err
	}
	res, err := otelenv.Resource(ctx, c.serviceName, c.version)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mpOpts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	for _, r := range c.readers {
		mpOpts = append(mpOpts, sdkmetric.WithReader(r))
	}
	readers := len(c.readers)
	var made []sdkmetric.Reader
	for _, e := range use {
		x, err := e.New(ctx, ExportSettings{Protocol: p.Protocol, Console: c.console})
		if err != nil {
			for _, r := range made {
				err = errors.Join(err, r.Shutdown(ctx))
			}
			return nil, fmt.Errorf("metrics: %s exporter: %w", e.Name, err)
		}
		if x.Handler != nil {
			p.handler = x.Handler
		}
		if x.Reader != nil {
			made = append(made, x.Reader)
			mpOpts = append(mpOpts, sdkmetric.WithReader(x.Reader))
			readers++
		}
	}
	if readers == 0 {
		p.MeterProvider = metricnoop.NewMeterProvider()
		return p, nil
	}
	p.sdk = sdkmetric.NewMeterProvider(mpOpts...)
	p.MeterProvider = p.sdk
	return p, nil
}

// chosen returns the exporters to build: those Always there, then those
// the environment names, each once; a name not given is an error.
func chosen(given map[string]Exporter, names []string) ([]Exporter, error) {
	var use []Exporter
	seen := map[string]bool{}
	for _, e := range given {
		if e.Always {
			use, seen[e.Name] = append(use, e), true
		}
	}
	slices.SortFunc(use, func(a, b Exporter) int { return strings.Compare(a.Name, b.Name) })
	for _, name := range names {
		e, ok := given[name]
		if !ok {
			return nil, fmt.Errorf("metrics: %w", otelenv.NotLinked("OTEL_METRICS_EXPORTER", name, "metrics/"+name, "MetricExporters"))
		}
		if !seen[name] {
			use, seen[name] = append(use, e), true
		}
	}
	return use, nil
}

// disabledProvider is Setup under OTEL_SDK_DISABLED=true: a no-op provider
// whose handler, when a pull exporter was given, serves nothing.
func disabledProvider(ctx context.Context, given map[string]Exporter, console io.Writer) (*Provider, error) {
	p := &Provider{MeterProvider: metricnoop.NewMeterProvider(), Disabled: true}
	for _, e := range given {
		if !e.Always {
			continue
		}
		x, err := e.New(ctx, ExportSettings{Console: console, Disabled: true})
		if err != nil {
			return nil, fmt.Errorf("metrics: %s exporter: %w", e.Name, err)
		}
		if x.Handler != nil {
			p.handler = x.Handler
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
	if p == nil || p.sdk == nil {
		return nil
	}
	if err := p.sdk.Shutdown(ctx); err != nil && !errors.Is(err, sdkmetric.ErrReaderShutdown) {
		return fmt.Errorf("metrics: shutdown: %w", err)
	}
	return nil
}
