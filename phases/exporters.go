package phases

import (
	"github.com/phasegate/phasegate/metrics"
	metricsconsole "github.com/phasegate/phasegate/metrics/console"
	metricsotlp "github.com/phasegate/phasegate/metrics/otlp"
	"github.com/phasegate/phasegate/metrics/prometheus"
	"github.com/phasegate/phasegate/tracing"
	tracingconsole "github.com/phasegate/phasegate/tracing/console"
	tracingotlp "github.com/phasegate/phasegate/tracing/otlp"
)

// TraceExporters are the span exporters the daemon holds: the two
// OTEL_TRACES_EXPORTER may name, otlp and console.
func TraceExporters() []tracing.Exporter {
	return []tracing.Exporter{tracingotlp.Exporter(), tracingconsole.Exporter()}
}

// MetricExporters are the metric exporters the daemon holds: the
// Prometheus registry its /metrics serves, and the otlp and console pushes
// OTEL_METRICS_EXPORTER may name.
func MetricExporters() []metrics.Exporter {
	return []metrics.Exporter{prometheus.Exporter(), metricsotlp.Exporter(), metricsconsole.Exporter()}
}
