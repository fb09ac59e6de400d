package otlp

import (
	"context"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/phasegate/phasegate/internal/otelenv"
	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/metrics/export"
)

// Exporter returns the "otlp" exporter, for [metrics.WithExporters] or
// app.Config.MetricExporters.
func Exporter() metrics.Exporter {
	return export.Push(metrics.ExporterOTLP, open)
}

func open(ctx context.Context, s metrics.ExportSettings) (sdkmetric.Exporter, error) {
	// Both read the OTEL_EXPORTER_OTLP_* endpoint, header, timeout and
	// certificate variables themselves, and dial at the first push.
	if s.Protocol == otelenv.ProtocolGRPC {
		return otlpmetricgrpc.New(ctx)
	}
	return otlpmetrichttp.New(ctx)
}
