package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/phasegate/phasegate/internal/otelenv"
)

// Exporter names accepted in OTEL_TRACES_EXPORTER, a comma-separated list.
const (
	ExporterNone    = otelenv.None
	ExporterOTLP    = "otlp"
	ExporterConsole = "console"
)

// Provider is a tracer provider built by [Setup] and the means to flush it.
type Provider struct {
	trace.TracerProvider
	// Exporter is "none" when no span is exported, else the exporters in
	// use joined by commas: "otlp", "console", "otlp,console".
	Exporter string
	// Exporters lists the exporters in use, in the order
	// OTEL_TRACES_EXPORTER gave them; empty when Exporter is "none".
	Exporters []string
	// Protocol is the OTLP protocol, "grpc" or "http/protobuf"; empty
	// unless Exporters holds "otlp".
	Protocol string
	// Disabled is true when OTEL_SDK_DISABLED=true turned tracing off.
	Disabled bool

	sdk *sdktrace.TracerProvider // nil when Exporter is "none"
}

// Shutdown flushes buffered spans and stops the exporters. It is safe to
// call on a provider whose exporter is "none", and more than once.
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
// Setup's own (a sampler, a span processor for tests). They are unused when
// no exporter is configured: the provider is then a no-op.
func WithProviderOptions(opts ...sdktrace.TracerProviderOption) Option {
	return func(c *config) { c.spanOpts = append(c.spanOpts, opts...) }
}

// Setup returns a tracer provider configured from the environment.
//
// OTEL_SDK_DISABLED=true returns a no-op provider and reads nothing else.
// Otherwise OTEL_TRACES_EXPORTER is a comma-separated list of "otlp" and
// "console"; unset, empty or "none" returns a no-op provider that makes no
// connection. Each exporter gets its own batch processor, so a collector
// that is slow or down does not hold up the others. An unknown exporter or
// protocol is an error, so that a typo does not silently turn tracing off.
func Setup(ctx context.Context, opts ...Option) (*Provider, error) {
	c := config{serviceName: "phasegate", console: os.Stderr}
	for _, o := range opts {
		o(&c)
	}
	disabled, err := otelenv.Disabled()
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	if disabled {
		return &Provider{TracerProvider: noop.NewTracerProvider(), Exporter: ExporterNone, Disabled: true}, nil
	}
	names, err := otelenv.Exporters("OTEL_TRACES_EXPORTER", ExporterOTLP, ExporterConsole)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	if len(names) == 0 {
		return &Provider{TracerProvider: noop.NewTracerProvider(), Exporter: ExporterNone}, nil
	}
	p := &Provider{Exporter: strings.Join(names, ","), Exporters: names}
	if slices.Contains(names, ExporterOTLP) {
		if p.Protocol, err = otelenv.Protocol("TRACES"); err != nil {
			return nil, fmt.Errorf("tracing: %w", err)
		}
	}
	res, err := otelenv.Resource(ctx, c.serviceName, c.version)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	spOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	var made []sdktrace.SpanExporter
	for _, name := range names {
		exp, err := newExporter(ctx, name, p.Protocol, c.console)
		if err != nil {
			for _, e := range made {
				err = errors.Join(err, e.Shutdown(ctx))
			}
			return nil, fmt.Errorf("tracing: %s exporter: %w", name, err)
		}
		made = append(made, exp)
		spOpts = append(spOpts, sdktrace.WithBatcher(exp))
	}
	p.sdk = sdktrace.NewTracerProvider(append(spOpts, c.spanOpts...)...)
	p.TracerProvider = p.sdk
	return p, nil
}

func newExporter(ctx context.Context, name, protocol string, console io.Writer) (sdktrace.SpanExporter, error) {
	switch name {
	case ExporterConsole:
		return stdouttrace.New(stdouttrace.WithWriter(console))
	case ExporterOTLP:
		// The exporters read OTEL_EXPORTER_OTLP_ENDPOINT, _HEADERS,
		// _TIMEOUT, _INSECURE and the certificate variables themselves.
		// Neither dials before the first export, so a collector that is
		// down does not delay startup.
		if protocol == otelenv.ProtocolGRPC {
			return otlptracegrpc.New(ctx)
		}
		return otlptracehttp.New(ctx)
	}
	return nil, fmt.Errorf("no exporter named %q", name) // otelenv.Exporters lets only known names through
}
