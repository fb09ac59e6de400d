package grpccalls

import (
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
)

// Propagator is the W3C trace context and baggage propagator that servers
// built on this package read incoming calls with. It is passed explicitly
// rather than set globally, so that nothing depends on process-wide state.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// ServerOption traces and measures a gRPC server's calls with otelgrpc:
// a server span per call, child of the caller's span when the call carries
// a W3C traceparent, and the rpc.server.* metrics on mp. Health checks
// (grpc.health.v1) and server reflection are left out of both: a checker
// polling every few seconds would flood the trace store with spans that
// say nothing. tp and mp may be nil (no spans, no metrics).
func ServerOption(tp trace.TracerProvider, mp metric.MeterProvider) grpc.ServerOption {
	opts := []otelgrpc.Option{
		otelgrpc.WithPropagators(Propagator()),
		otelgrpc.WithFilter(filters.None(
			filters.HealthCheck(),
			filters.ServicePrefix("grpc.reflection."),
		)),
	}
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	opts = append(opts, otelgrpc.WithTracerProvider(tp), otelgrpc.WithMeterProvider(mp))
	return grpc.StatsHandler(otelgrpc.NewServerHandler(opts...))
}
