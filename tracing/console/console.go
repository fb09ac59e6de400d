package console

import (
	"context"

	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/phasegate/phasegate/tracing"
	"github.com/phasegate/phasegate/tracing/export"
)

// Exporter returns the "console" exporter, for [tracing.WithExporters] or
// app.Config.TraceExporters.
func Exporter() tracing.Exporter {
	return export.Exporter(tracing.ExporterConsole, func(_ context.Context, s tracing.ExportSettings) (sdktrace.SpanExporter, error) {
		return stdouttrace.New(stdouttrace.WithWriter(s.Console))
	})
}
