// Package export builds the metrics package's meter provider on the
// OpenTelemetry SDK.
//
// [Push] makes a [metrics.Exporter] of any SDK metric exporter, [Pull] of
// any SDK reader scraped over HTTP.
//
// The SDK is linked here and not in package metrics, so that a service
// exporting no metric does not link it: metrics/otlp, metrics/console
// and metrics/prometheus are built on this package, and so is an
// exporter of a service's own. The provider it builds is read by every
// exporter in use, and measures gRPC calls with package
// tracing/grpccalls.
package export
