package otlp

import (
	"context"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/phasegate/phasegate/internal/otelenv"
	"github.com/phasegate/phasegate/tracing"
	"github.com/phasegate/phasegate/tracing/export"
)

// Exporter returns the "otlp" exporter, for [tracing.WithExporters] or
// app.Config.TraceExporters.
func Exporter() tracing.Exporter {
	return export.Exporter(tracing.ExporterOTLP, open)
}

func open(ctx context.Context, s tracing.ExportSettings) (sdktrace.SpanExporter, error) {
	// The exporters read OTEL_EXPORTER_OTLP_ENDPOINT, _HEADERS, _TIMEOUT,
	// _INSECURE and the certificate variables themselves. Neither dials
	// before the first export, so a collector that is down does not delay
	// startup.
	if s.Protocol == otelenv.ProtocolGRPC {
		return otlptracegrpc.New(ctx)
	}
	return otlptracehttp.New(ctx)
}
