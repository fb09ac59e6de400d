package export

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"

	"github.com/phasegate/phasegate/internal/otelsdk"
	"github.com/phasegate/phasegate/tracing"
	"github.com/phasegate/phasegate/tracing/grpccalls"
)

// Exporter returns the exporter called name (its name in
// OTEL_TRACES_EXPORTER, lower case) whose spans go to the SDK span
// exporter that open returns. [tracing.Setup] calls open only when the
// environment names the exporter; open must not dial, so that a
// collector that is down does not delay the start.
func Exporter(name string, open func(context.Context, tracing.ExportSettings) (sdktrace.SpanExporter, error)) tracing.Exporter {
	return tracing.Exporter{Name: name, Open: func(ctx context.Context, s tracing.ExportSettings) (tracing.Pipeline, error) {
		exp, err := open(ctx, s)
		if err != nil {
			return nil, err
		}
		return &pipeline{settings: s, exporter: exp}, nil
	}}
}

// pipeline is an opened Exporter: its SDK exporter, not yet batched.
type pipeline struct {
	settings tracing.ExportSettings
	exporter sdktrace.SpanExporter
}

// Join builds one SDK tracer provider with a batch processor for each
// pipeline of all, which must all be this package's.
func (p *pipeline) Join(ctx context.Context, all []tracing.Pipeline) (tracing.Joined, error) {
	res, err := otelsdk.Resource(ctx, p.settings.ServiceName, p.settings.Version)
	if err != nil {
		return tracing.Joined{}, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	for _, o := range all {
		q, ok := o.(*pipeline)
		if !ok {
			return tracing.Joined{}, fmt.Errorf("export: cannot join a pipeline of type %T: every exporter must be made by package tracing/export", o)
		}
		opts = append(opts, sdktrace.WithBatcher(q.exporter))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return tracing.Joined{
		TracerProvider: tp,
		Shutdown:       tp.Shutdown,
		ServerOption:   func(mp metric.MeterProvider) grpc.ServerOption { return grpccalls.ServerOption(tp, mp) },
	}, nil
}

// Shutdown stops the exporter of a pipeline that was not joined.
func (p *pipeline) Shutdown(ctx context.Context) error { return p.exporter.Shutdown(ctx) }
