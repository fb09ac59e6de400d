package console

import (
	"context"

	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/metrics/export"
)

// Exporter returns the "console" exporter, for [metrics.WithExporters] or
// app.Config.MetricExporters.
func Exporter() metrics.Exporter {
	return export.Push(metrics.ExporterConsole, func(_ context.Context, s metrics.ExportSettings) (sdkmetric.Exporter, error) {
		return stdoutmetric.New(stdoutmetric.WithWriter(s.Console))
	})
}
