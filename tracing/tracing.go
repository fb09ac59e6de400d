package tracing

import (
	"context"
	"fmt"
	"io"
	"strings"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"

	"github.com/phasegate/phasegate/internal/otelenv"
)

// Exporter names accepted in OTEL_TRACES_EXPORTER, a comma-separated list.
const (
	ExporterNone    = otelenv.None
	ExporterOTLP    = otelenv.OTLP
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

	joined Joined // the zero Joined when Exporter is "none"
}

// Shutdown flushes buffered spans and stops the exporters. It is safe to
// call on a provider whose exporter is "none", and more than once.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.joined.Shutdown == nil {
		return nil
	}
	if err := p.joined.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// GRPCServerOption traces a gRPC server's calls to p, and measures them
// on mp (a server span per call, continuing the caller's trace; package
// tracing/grpccalls). It is nil when no span is exported: the calls'
// instrumentation comes with the exporters, so that a service exporting
// nothing neither links otelgrpc nor pays for it on each call. p may be
// nil.
func (p *Provider) GRPCServerOption(mp metric.MeterProvider) grpc.ServerOption {
	if p == nil || p.joined.ServerOption == nil {
		return nil
	}
	return p.joined.ServerOption(mp)
}

// An Option adjusts [Setup].
type Option func(*config)

// config is what the options set.
type config = otelenv.Settings[Exporter]

// An Exporter is a span exporter that OTEL_TRACES_EXPORTER can name. A
// binary holds only the exporters given to [Setup] by [WithExporters]:
// packages tracing/otlp and tracing/console provide the two the
// specification names, and package tracing/export makes one of any
// OpenTelemetry SDK span exporter. The SDK comes with them: this package
// names no SDK type, so that a service exporting no span links neither
// the SDK nor any client.
type Exporter struct {
	// Name is the exporter's name in OTEL_TRACES_EXPORTER, lower case.
	Name string
	// Open opens the exporter; Setup calls it only when the environment
	// names it. It must not dial: a collector that is down must not delay
	// the start.
	Open func(ctx context.Context, s ExportSettings) (Pipeline, error)
}

// ExportSettings is what [Setup] hands an [Exporter]'s Open.
type ExportSettings struct {
	// Protocol is the OTLP protocol the environment asks for, "grpc" or
	// "http/protobuf"; empty unless OTEL_TRACES_EXPORTER lists "otlp".
	Protocol string
	// Console is where a console exporter writes ([WithConsoleWriter]).
	Console io.Writer
	// ServiceName and Version are the service's, as given to Setup: the
	// resource's defaults, which the environment overrides.
	ServiceName, Version string
}

// A Pipeline is an opened [Exporter]: for package tracing/export, an SDK
// span exporter that a batch processor of its own will feed.
type Pipeline interface {
	// Join builds the tracer provider that sends each span to every
	// pipeline of all: those Setup opened, in the order
	// OTEL_TRACES_EXPORTER names them, the receiver first. A pipeline
	// may refuse to join one another package opened.
	Join(ctx context.Context, all []Pipeline) (Joined, error)
	// Shutdown stops the exporter of a pipeline that was opened but not
	// joined, because another failed.
	Shutdown(ctx context.Context) error
}

// Joined is the tracer provider a [Pipeline] built, with what Setup's
// [Provider] needs of it.
type Joined struct {
	trace.TracerProvider
	// Shutdown flushes buffered spans and stops every joined exporter.
	Shutdown func(ctx context.Context) error
	// ServerOption traces a gRPC server's calls to the provider and
	// measures them on mp ([Provider.GRPCServerOption]).
	ServerOption func(mp metric.MeterProvider) grpc.ServerOption
}

// WithExporters gives Setup the exporters OTEL_TRACES_EXPORTER may name.
// A name the specification knows ("otlp", "console") that is not given
// is an error when the environment asks for it, naming the package that
// provides it; a later exporter of the same name replaces an earlier one.
func WithExporters(e ...Exporter) Option {
	return Option(otelenv.WithExporters(e))
}

// WithServiceName sets the service name used when OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES do not set one. The default is "phasegate".
func WithServiceName(name string) Option { return Option(otelenv.WithServiceName[Exporter](name)) }

// WithVersion sets service.version.
func WithVersion(v string) Option { return Option(otelenv.WithVersion[Exporter](v)) }

// WithConsoleWriter sets where the console exporter writes; stderr by default.
func WithConsoleWriter(w io.Writer) Option { return Option(otelenv.WithConsoleWriter[Exporter](w)) }

// Setup returns a tracer provider configured from the environment.
//
// OTEL_SDK_DISABLED=true returns a no-op provider and reads nothing else.
// Otherwise OTEL_TRACES_EXPORTER is a comma-separated list of "otlp",
// "console" and the names of the other exporters given by
// [WithExporters]; each must have been given. Unset, empty or "none"
// returns a no-op provider that makes no connection, with no SDK behind
// it. Each exporter gets its own batch processor, so a collector that is
// slow or down does not hold up the others. An unknown exporter or
// protocol is an error, so that a typo does not silently turn tracing off.
func Setup(ctx context.Context, opts ...Option) (*Provider, error) {
	c := otelenv.Apply(opts)
	disabled, err := otelenv.Disabled()
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	if disabled {
		return &Provider{TracerProvider: noop.NewTracerProvider(), Exporter: ExporterNone, Disabled: true}, nil
	}
	given, linked := c.Given(func(e Exporter) string { return e.Name })
	traces := otelenv.Signal{Name: "TRACES", Package: "tracing", Field: "TraceExporters"}
	names, protocol, err := traces.Choose([]string{ExporterOTLP, ExporterConsole}, linked)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	if len(names) == 0 {
		return &Provider{TracerProvider: noop.NewTracerProvider(), Exporter: ExporterNone}, nil
	}
	p := &Provider{Exporter: strings.Join(names, ","), Exporters: names, Protocol: protocol}
	settings := ExportSettings{Protocol: p.Protocol, Console: c.Console, ServiceName: c.ServiceName, Version: c.Version}
	opened, err := otelenv.Open(ctx, names, func(name string) (Pipeline, error) { return given[name].Open(ctx, settings) })
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	if p.joined, err = opened[0].Join(ctx, opened); err != nil {
		return nil, fmt.Errorf("tracing: %w", otelenv.Shutdown(ctx, opened, err))
	}
	p.TracerProvider = p.joined.TracerProvider
	return p, nil
}
