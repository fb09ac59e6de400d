package console

import (
	"context"

	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/phasegate/phasegate/metrics"
)

// Exporter returns the "console" exporter, for [metrics.WithExporters] or
// app.Config.MetricExporters.
func Exporter() metrics.Exporter {
	return metrics.Exporter{Name: metrics.ExporterConsole, New: func(_ context.Context, s metrics.ExportSettings) (metrics.Export, error) {
		exp, err := stdoutmetric.New(stdoutmetric.WithWriter(s.Console))
		if err != nil {
			return metrics.Export{}, err
		}
		return metrics.Export{Reader: sdkmetric.NewPeriodicReader(exp)}, nil
	}}
}
