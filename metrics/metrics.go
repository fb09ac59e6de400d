package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/phasegate/phasegate/internal/otelenv"
)

// Exporter names accepted in OTEL_METRICS_EXPORTER, a comma-separated list.
//
// The in-process Prometheus registry that [Provider.Handler] serves is
// always there, listed or not: "prometheus" names it and adds nothing. In
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

	sdk *sdkmetric.MeterProvider
	reg *prometheus.Registry
}

// An Option adjusts [Setup].
type Option func(*config)

type config struct {
	serviceName string
	version     string
	console     io.Writer
	readers     []sdkmetric.Reader
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
// empty registry, and reads nothing else. Otherwise the Prometheus
// registry served by [Provider.Handler] holds every instrument and the Go
// runtime and process collectors, and OTEL_METRICS_EXPORTER, a
// comma-separated list of "otlp", "console", "prometheus" or "none", adds
// push exporters: each pushes every OTEL_METRIC_EXPORT_INTERVAL (default
// 60s). "otlp" pushes to OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or
// OTEL_EXPORTER_OTLP_ENDPOINT, with the protocol in
// OTEL_EXPORTER_OTLP_METRICS_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL
// (default http/protobuf), and makes no connection before its first push;
// "console" writes JSON to the console writer. An unknown exporter or
// protocol is an error, so that a typo does not silently drop metrics.
func Setup(ctx context.Context, opts ...Option) (*Provider, error) {
	c := config{serviceName: "phasegate", console: os.Stderr}
	for _, o := range opts {
		o(&c)
	}
	disabled, err := otelenv.Disabled()
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if disabled {
		return &Provider{MeterProvider: metricnoop.NewMeterProvider(), Disabled: true, reg: prometheus.NewRegistry()}, nil
	}
	p := &Provider{reg: prometheus.NewRegistry()}
	if p.Exporters, err = otelenv.Exporters("OTEL_METRICS_EXPORTER", ExporterOTLP, ExporterConsole, ExporterPrometheus); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if p.OTLP = slices.Contains(p.Exporters, ExporterOTLP); p.OTLP {
		if p.Protocol, err = otelenv.Protocol("METRICS"); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	if err := p.reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if err := p.reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	res, err := otelenv.Resource(ctx, c.serviceName, c.version)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	prom, err := otelprom.New(
		otelprom.WithRegisterer(p.reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
		otelprom.WithoutScopeInfo(),
	)
	if err != nil {
		return nil, fmt.Errorf("metrics: prometheus exporter: %w", err)
	}
	mpOpts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom)}
	for _, r := range c.readers {
		mpOpts = append(mpOpts, sdkmetric.WithReader(r))
	}
	var made []sdkmetric.Exporter
	for _, name := range p.Exporters {
		var exp sdkmetric.Exporter
		switch name {
		case ExporterPrometheus:
			continue // the registry above
		case ExporterConsole:
			exp, err = stdoutmetric.New(stdoutmetric.WithWriter(c.console))
		case ExporterOTLP:
			exp, err = newOTLP(ctx, p.Protocol)
		}
		if err != nil {
			for _, e := range made {
				err = errors.Join(err, e.Shutdown(ctx))
			}
			return nil, fmt.Errorf("metrics: %s exporter: %w", name, err)
		}
		made = append(made, exp)
		mpOpts = append(mpOpts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
	}
	p.sdk = sdkmetric.NewMeterProvider(mpOpts...)
	p.MeterProvider = p.sdk
	return p, nil
}

// Handler serves the Prometheus text exposition of every metric; when
// Disabled, an empty one (200, no samples), so that a scraper sees the
// daemon up rather than a broken target.
func (p *Provider) Handler() http.Handler {
	return promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

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

func newOTLP(ctx context.Context, protocol string) (sdkmetric.Exporter, error) {
	// Both read the OTEL_EXPORTER_OTLP_* endpoint, header, timeout and
	// certificate variables themselves.
	if protocol == otelenv.ProtocolGRPC {
		return otlpmetricgrpc.New(ctx)
	}
	return otlpmetrichttp.New(ctx)
}
