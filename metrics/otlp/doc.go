// Package otlp provides the "otlp" metric exporter of package metrics.
//
// It pushes over gRPC or HTTP/protobuf, as
// OTEL_EXPORTER_OTLP_METRICS_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL says,
// every OTEL_METRIC_EXPORT_INTERVAL. It is its own package so that a binary
// that pushes no metric over OTLP does not link the two OTLP clients and
// their protobuf types.
package otlp
