package otlp

import (
	"context"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/phasegate/phasegate/internal/otelenv"
	"github.com/phasegate/phasegate/metrics"
)

// Exporter returns the "otlp" exporter, for [metrics.WithExporters] or
// app.Config.MetricExporters.
func Exporter() metrics.Exporter {
	return metrics.Exporter{Name: metrics.ExporterOTLP, New: newExporter}
}

func newExporter(ctx context.Context, s metrics.ExportSettings) (metrics.Export, error) {
	// Both read the OTEL_EXPORTER_OTLP_* endpoint, header, timeout and
	// certificate variables themselves, and dial at the first push.
	var exp sdkmetric.Exporter
	var err error
	if s.Protocol == otelenv.ProtocolGRPC {
		exp, err = otlpmetricgrpc.New(ctx)
	} else {
		exp, err = otlpmetrichttp.New(ctx)
	}
	if err != nil {
		return metrics.Export{}, err
	}
	return metrics.Export{Reader: sdkmetric.NewPeriodicReader(exp)}, nil
}
