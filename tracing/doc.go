// Package tracing builds an OpenTelemetry tracer provider from the standard
// OTEL_* environment, over the exporters given to [Setup] by
// [WithExporters].
//
// The exporters are tracing/otlp and tracing/console, each a package of its
// own so that a binary links only those it gives. One the environment asks
// for but not given is an error naming its package. This package uses the
// OpenTelemetry API alone: the SDK comes with the exporters, built on
// tracing/export, which builds the SDK provider from every exporter the
// environment names and traces gRPC calls with it
// ([Provider.GRPCServerOption]). With no exporter the provider is the
// API's no-op, and a binary links neither the SDK nor otelgrpc.
//
// Tracing is off unless asked for: OTEL_TRACES_EXPORTER defaults to "none",
// so a daemon makes no network connection it was not told to. Otherwise it
// is a comma-separated list (names are case-insensitive; repeats count
// once): "otlp" exports over OTLP, by gRPC or HTTP/protobuf as
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL says
// (default http/protobuf), to OTEL_EXPORTER_OTLP_ENDPOINT; "console" writes
// spans as JSON to a writer, stderr by default. "otlp,console" does both,
// each exporter behind its own batch processor. OTEL_SDK_DISABLED=true
// turns tracing off whatever else is set.
//
// A value Setup does not know — an exporter, a protocol, a boolean that is
// neither true nor false — is an error naming the variable, not a warning
// and a default: a typo must not silently drop the traces an operator
// asked for. "http/json", which the specification names, is refused too:
// the Go exporters do not speak it.
//
// The resource carries service.name, service.version and host.name. The
// defaults given to [Setup] lose to the environment: OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES always win, which the SDK alone would not
// guarantee (sdktrace.WithResource lets its argument override the
// environment).
//
// The exporters are chosen here rather than by contrib's autoexport
// package, which (at v0.72.0) takes one exporter name only, ignores
// OTEL_SDK_DISABLED and writes its console output to stdout only;
// tracing/internal/autoexportcmp measures the two side by side.
package tracing
