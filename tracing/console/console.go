package console

import (
	"context"

	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/phasegate/phasegate/tracing"
)

// Exporter returns the "console" exporter, for [tracing.WithExporters] or
// app.Config.TraceExporters.
func Exporter() tracing.Exporter {
	return tracing.Exporter{Name: tracing.ExporterConsole, New: func(_ context.Context, s tracing.ExportSettings) (sdktrace.SpanExporter, error) {
		return stdouttrace.New(stdouttrace.WithWriter(s.Console))
	}}
}
