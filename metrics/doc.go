// Package metrics exports a daemon's metrics through the OpenTelemetry
// metrics SDK, over the exporters given to [Setup] by [WithExporters].
//
// This package uses the OpenTelemetry API alone: the SDK comes with the
// exporters, built on metrics/export, which builds the SDK provider that
// every exporter in use reads and measures gRPC calls with it
// ([Provider.GRPCServerOption]). With no exporter the provider is the
// API's no-op, and a binary links neither the SDK nor otelgrpc.
//
// It exports, with metrics/prometheus, always to a Prometheus registry that
// [Provider.Handler] serves (GET /metrics, text exposition format, on
// whatever port the daemon mounts it), and also to the push exporters
// (metrics/otlp, metrics/console) that OTEL_METRICS_EXPORTER lists. Each
// exporter is a package of its own so that a binary links only those it
// gives; given none, the meter provider is a no-op.
//
// OTEL_METRICS_EXPORTER is a comma-separated list (case-insensitive;
// repeats count once) of:
//   - "otlp": push over OTLP, by gRPC or HTTP/protobuf as
//     OTEL_EXPORTER_OTLP_METRICS_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL
//     says (default http/protobuf), every OTEL_METRIC_EXPORT_INTERVAL;
//   - "console": write JSON to a writer, stderr by default, as often;
//   - "prometheus": the in-process registry, which is there anyway when
//     metrics/prometheus was given. It
//     starts no HTTP server of its own: OTEL_EXPORTER_PROMETHEUS_HOST and
//     OTEL_EXPORTER_PROMETHEUS_PORT are ignored, because a second port with
//     a second registry (what contrib's autoexport does for this name)
//     would split the daemon's metrics in two places;
//   - "none", or nothing: no push exporter.
//
// OTEL_SDK_DISABLED=true turns metrics off: a no-op meter provider and an
// empty /metrics. An unknown exporter or protocol, or an OTEL_SDK_DISABLED
// that is neither true nor false, is an error naming the variable, so a
// typo does not silently drop metrics; so is an exporter the binary was
// not given, naming the package that provides it.
//
// One SDK provider behind every exporter means every instrument is
// declared once, with the OpenTelemetry API that the rest of the project
// (tracing, otelgrpc) already uses, and pulled by Prometheus or pushed to
// a collector without a second instrumentation. The resource follows the
// tracing package's rule: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
// win over the name given to [Setup].
//
// [ObserveLifecycle] instruments a [lifecycle.Lifecycle]: the duration of
// each phase and background task by outcome, the lifecycle state, the time
// since the start and the startup duration, and the progress, rate and
// time left of running phases. [HealthChecks] counts the health checks a
// daemon answers, by dialect and result.
//
// Names follow the OpenTelemetry conventions ("phasegate.phase.duration",
// unit "s"); the Prometheus exporter turns them into Prometheus names
// ("phasegate_phase_duration_seconds").
package metrics
