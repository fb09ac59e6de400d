// Package export builds tracing's tracer provider on the OpenTelemetry
// SDK.
//
// [Exporter] makes a [tracing.Exporter] of any SDK span exporter.
//
// The SDK is linked here and not in package tracing, so that a service
// exporting no span does not link it: tracing/otlp and tracing/console
// are built on this package, and so is an exporter of a service's own.
// The provider it builds sends each span to every exporter the
// environment names, each behind a batch processor of its own, and
// traces gRPC calls with package tracing/grpccalls.
package export
