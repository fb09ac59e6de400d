package metrics

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Exporter names accepted in OTEL_METRICS_EXPORTER, a comma-separated list.
// The Prometheus registry is always there; "otlp" adds a push exporter.
const (
	ExporterNone       = "none"
	ExporterPrometheus = "prometheus"
	ExporterOTLP       = "otlp"
)

// Provider is a meter provider built by [Setup], the Prometheus registry it
// feeds and the means to flush it.
type Provider struct {
	metric.MeterProvider
	// OTLP is true when metrics are also pushed over OTLP; Protocol is then
	// "grpc" or "http/protobuf".
	OTLP     bool
	Protocol string

	sdk *sdkmetric.MeterProvider
	reg *prometheus.Registry
}

// An Option adjusts [Setup].
type Option func(*config)

type config struct {
	serviceName string
	version     string
	readers     []sdkmetric.Reader
}

// WithServiceName sets service.name when OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES do not. The default is "phasegate".
func WithServiceName(name string) Option { return func(c *config) { c.serviceName = name } }

// WithVersion sets service.version.
func WithVersion(v string) Option { return func(c *config) { c.version = v } }

// WithReader adds a reader, such as an sdkmetric.ManualReader in tests.
func WithReader(r sdkmetric.Reader) Option {
	return func(c *config) { c.readers = append(c.readers, r) }
}

// Setup returns a meter provider configured from the environment. Its
// Prometheus registry, served by [Provider.Handler], also holds the Go
// runtime and process collectors. With OTEL_METRICS_EXPORTER=otlp it also
// pushes every OTEL_METRIC_EXPORT_INTERVAL (default 60s) to the endpoint
// in OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT,
// with the protocol in OTEL_EXPORTER_OTLP_METRICS_PROTOCOL or
// OTEL_EXPORTER_OTLP_PROTOCOL (default http/protobuf). An unknown exporter
// or protocol is an error, so that a typo does not silently drop metrics.
// No connection is made before the first push.
func Setup(ctx context.Context, opts ...Option) (*Provider, error) {
	c := config{serviceName: "phasegate"}
	for _, o := range opts {
		o(&c)
	}
	p := &Provider{reg: prometheus.NewRegistry()}
	for _, name := range strings.Split(os.Getenv("OTEL_METRICS_EXPORTER"), ",") {
		switch name = strings.ToLower(strings.TrimSpace(name)); name {
		case "", ExporterNone, ExporterPrometheus:
		case ExporterOTLP:
			p.OTLP = true
		default:
			return nil, fmt.Errorf("metrics: OTEL_METRICS_EXPORTER=%q: want otlp, prometheus or none", os.Getenv("OTEL_METRICS_EXPORTER"))
		}
	}
	if err := p.reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if err := p.reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
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
	res, err := newResource(ctx, c)
	if err != nil {
		return nil, err
	}
	mpOpts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom)}
	for _, r := range c.readers {
		mpOpts = append(mpOpts, sdkmetric.WithReader(r))
	}
	if p.OTLP {
		p.Protocol = otlpProtocol()
		exp, err := newOTLP(ctx, p.Protocol)
		if err != nil {
			return nil, fmt.Errorf("metrics: otlp exporter: %w", err)
		}
		mpOpts = append(mpOpts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
	}
	p.sdk = sdkmetric.NewMeterProvider(mpOpts...)
	p.MeterProvider = p.sdk
	return p, nil
}

// Handler serves the Prometheus text exposition of every metric.
func (p *Provider) Handler() http.Handler {
	return promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Shutdown pushes what is left over OTLP and stops the provider. It is
// safe to call more than once.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	if err := p.sdk.Shutdown(ctx); err != nil && !errors.Is(err, sdkmetric.ErrReaderShutdown) {
		return fmt.Errorf("metrics: shutdown: %w", err)
	}
	return nil
}

// otlpProtocol applies the spec's precedence: the signal-specific variable,
// then the general one, then the default http/protobuf.
func otlpProtocol() string {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := strings.TrimSpace(os.Getenv(k)); v != "" {
			return v
		}
	}
	return "http/protobuf"
}

func newOTLP(ctx context.Context, protocol string) (sdkmetric.Exporter, error) {
	// Both read the OTEL_EXPORTER_OTLP_* endpoint, header, timeout and
	// certificate variables themselves.
	switch protocol {
	case "grpc":
		return otlpmetricgrpc.New(ctx)
	case "http/protobuf":
		return otlpmetrichttp.New(ctx)
	}
	return nil, fmt.Errorf("OTLP protocol %q: want grpc or http/protobuf", protocol)
}

// newResource builds the resource with the environment applied last, so
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the defaults.
func newResource(ctx context.Context, c config) (*resource.Resource, error) {
	attrs := []resource.Option{resource.WithAttributes(semconv.ServiceName(c.serviceName))}
	if c.version != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceVersion(c.version)))
	}
	r, err := resource.New(ctx, append(append([]resource.Option{resource.WithTelemetrySDK(), resource.WithHost()}, attrs...), resource.WithFromEnv())...)
	if err != nil {
		return nil, fmt.Errorf("metrics: resource: %w", err)
	}
	return r, nil
}
