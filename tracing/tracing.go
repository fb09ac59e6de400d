package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

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
	exporters   []Exporter
}

// An Exporter is a span exporter that OTEL_TRACES_EXPORTER can name. A
// binary holds only the exporters given to [Setup] by [WithExporters]:
// packages tracing/otlp and tracing/console provide the two the
// specification names, so a service that exports no span links neither
// (nor gRPC's or HTTP's OTLP client).
type Exporter struct {
	// Name is the exporter's name in OTEL_TRACES_EXPORTER, lower case.
	Name string
	// New builds the exporter; Setup calls it only when the environment
	// names it. It must not dial: a collector that is down must not
	// delay the start.
	New func(ctx context.Context, s ExportSettings) (sdktrace.SpanExporter, error)
}

// ExportSettings is what [Setup] hands an [Exporter]'s New.
type ExportSettings struct {
	// Protocol is the OTLP protocol the environment asks for, "grpc" or
	// "http/protobuf"; empty unless OTEL_TRACES_EXPORTER lists "otlp".
	Protocol string
	// Console is where a console exporter writes ([WithConsoleWriter]).
	Console io.Writer
}

// WithExporters gives Setup the exporters OTEL_TRACES_EXPORTER may name.
// A name the specification knows ("otlp", "console") that is not given
// is an error when the environment asks for it, naming the package that
// provides it; a later exporter of the same name replaces an earlier one.
func WithExporters(e ...Exporter) Option {
	return func(c *config) { c.exporters = append(c.exporters, e...) }
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
// Otherwise OTEL_TRACES_EXPORTER is a comma-separated list of "otlp",
// "console" and the names of the other exporters given by
// [WithExporters]; each must have been given. Unset, empty or "none" returns a no-op provider that makes no
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
	given := map[string]Exporter{}
	known := []string{ExporterOTLP, ExporterConsole}
	for _, e := range c.exporters {
		given[e.Name] = e
		known = append(known, e.Name)
	}
	names, err := otelenv.Exporters("OTEL_TRACES_EXPORTER", known...)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	for _, name := range names {
		if _, ok := given[name]; !ok {
			return nil, fmt.Errorf("tracing: %w", otelenv.NotLinked("OTEL_TRACES_EXPORTER", name, "tracing/"+name, "TraceExporters"))
		}
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
		exp, err := given[name].New(ctx, ExportSettings{Protocol: p.Protocol, Console: c.console})
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
