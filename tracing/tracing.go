package tracing

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Exporter names accepted in OTEL_TRACES_EXPORTER.
const (
	ExporterNone    = "none"
	ExporterOTLP    = "otlp"
	ExporterConsole = "console"
)

// Provider is a tracer provider built by [Setup] and the means to flush it.
type Provider struct {
	trace.TracerProvider
	// Exporter is the exporter in use: "none", "otlp" or "console".
	Exporter string
	// Protocol is the OTLP protocol, "grpc" or "http/protobuf"; empty
	// unless Exporter is "otlp".
	Protocol string

	sdk *sdktrace.TracerProvider // nil when Exporter is "none"
}

// Shutdown flushes buffered spans and stops the exporter. It is safe to call
// on a provider whose exporter is "none", and more than once.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	if err := p.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// An Option adjusts [Setup].
type Option func(*config)

type config struct {
	serviceName string
	version     string
	console     io.Writer
	spanOpts    []sdktrace.TracerProviderOption
}

// WithServiceName sets the service name used when OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES do not set one. The default is "phasegate".
func WithServiceName(name string) Option { return func(c *config) { c.serviceName = name } }

// WithVersion sets service.version.
func WithVersion(v string) Option { return func(c *config) { c.version = v } }

// WithConsoleWriter sets where the console exporter writes; stderr by default.
func WithConsoleWriter(w io.Writer) Option { return func(c *config) { c.console = w } }

// WithProviderOptions passes extra options to the SDK tracer provider, after
// Setup's own (a sampler, a span processor for tests).
func WithProviderOptions(opts ...sdktrace.TracerProviderOption) Option {
	return func(c *config) { c.spanOpts = append(c.spanOpts, opts...) }
}

// Setup returns a tracer provider configured from the environment. With
// OTEL_TRACES_EXPORTER unset or "none" it returns a no-op provider and makes
// no connection. An unknown exporter or protocol is an error, so that a typo
// does not silently turn tracing off.
func Setup(ctx context.Context, opts ...Option) (*Provider, error) {
	c := config{serviceName: "phasegate", console: os.Stderr}
	for _, o := range opts {
		o(&c)
	}
	exporter := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")))
	if exporter == "" {
		exporter = ExporterNone
	}
	if strings.Contains(exporter, ",") {
		return nil, fmt.Errorf("tracing: OTEL_TRACES_EXPORTER=%q: only one exporter is supported", exporter)
	}
	p := &Provider{Exporter: exporter}
	var exp sdktrace.SpanExporter
	var err error
	switch exporter {
	case ExporterNone:
		p.TracerProvider = noop.NewTracerProvider()
		return p, nil
	case ExporterConsole:
		exp, err = stdouttrace.New(stdouttrace.WithWriter(c.console))
	case ExporterOTLP:
		p.Protocol = otlpProtocol()
		exp, err = newOTLP(ctx, p.Protocol)
	default:
		return nil, fmt.Errorf("tracing: OTEL_TRACES_EXPORTER=%q: want otlp, console or none", exporter)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: %s exporter: %w", exporter, err)
	}
	res, err := newResource(ctx, c)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, err
	}
	p.sdk = sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
	}, c.spanOpts...)...)
	p.TracerProvider = p.sdk
	return p, nil
}

// otlpProtocol applies the spec's precedence: the signal-specific variable,
// then the general one, then the default http/protobuf.
func otlpProtocol() string {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := strings.TrimSpace(os.Getenv(k)); v != "" {
			return v
		}
	}
	return "http/protobuf"
}

func newOTLP(ctx context.Context, protocol string) (*otlptrace.Exporter, error) {
	// The exporters read OTEL_EXPORTER_OTLP_ENDPOINT, _HEADERS, _TIMEOUT,
	// _INSECURE and the certificate variables themselves. Neither dials
	// before the first export, so a collector that is down does not delay
	// startup.
	switch protocol {
	case "grpc":
		return otlptracegrpc.New(ctx)
	case "http/protobuf":
		return otlptracehttp.New(ctx)
	}
	return nil, fmt.Errorf("OTLP protocol %q: want grpc or http/protobuf", protocol)
}

// newResource builds the resource with the environment applied last, so it
// overrides the defaults instead of the other way round.
func newResource(ctx context.Context, c config) (*resource.Resource, error) {
	attrs := resource.WithAttributes(semconv.ServiceName(c.serviceName))
	if c.version != "" {
		attrs = resource.WithAttributes(semconv.ServiceName(c.serviceName), semconv.ServiceVersion(c.version))
	}
	r, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		attrs,
		resource.WithFromEnv(),
	)
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return r, nil
}
