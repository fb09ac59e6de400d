// Package tracing builds an OpenTelemetry tracer provider from the standard
// OTEL_* environment.
//
// Tracing is off unless asked for: OTEL_TRACES_EXPORTER defaults to "none", so
// a daemon makes no network connection it was not told to. "otlp" exports
// over OTLP, by gRPC or HTTP/protobuf as OTEL_EXPORTER_OTLP_PROTOCOL (or its
// _TRACES_ variant) says, to OTEL_EXPORTER_OTLP_ENDPOINT; "console" writes
// spans as JSON to a writer, stderr by default.
//
// The resource carries service.name, service.version and host.name. The
// defaults given to [Setup] lose to the environment: OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES always win, which the SDK alone would not
// guarantee (sdktrace.WithResource lets its argument override the
// environment).
package tracing
