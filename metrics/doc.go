// Package metrics exports a daemon's metrics through the OpenTelemetry
// metrics SDK: always to a Prometheus registry that [Provider.Handler]
// serves (GET /metrics, text exposition format), and also over OTLP when
// OTEL_METRICS_EXPORTER asks for it.
//
// One SDK behind both exporters means every instrument is declared once,
// with the OpenTelemetry API that the rest of the project (tracing,
// otelgrpc) already uses, and pulled by Prometheus or pushed to a
// collector without a second instrumentation.
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
