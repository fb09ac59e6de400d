// Package otlp provides the "otlp" span exporter of package tracing.
//
// It exports over gRPC or HTTP/protobuf, as
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL says, to
// OTEL_EXPORTER_OTLP_ENDPOINT. It is its own package so that a binary that
// exports no span over OTLP does not link the two OTLP clients and their
// protobuf types.
package otlp
