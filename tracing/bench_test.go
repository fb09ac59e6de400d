package tracing_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/phasegate/phasegate/tracing"
	tracingconsole "github.com/phasegate/phasegate/tracing/console"
	tracingotlp "github.com/phasegate/phasegate/tracing/otlp"
)

// BenchmarkSetup measures what Setup costs a daemon's start for each
// exporter, side by side: "none" and "disabled" are the baselines (no SDK
// at all); the others build the resource, the exporters and their batch
// processors, then Shutdown stops them. Nothing is dialled: no span is
// ended, so there is nothing to export.
func BenchmarkSetup(b *testing.B) {
	col := httptest.NewServer(http.NotFoundHandler())
	defer col.Close()
	for _, bc := range []struct {
		name string
		env  map[string]string
	}{
		{"none", nil},
		{"disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}},
		{"console", map[string]string{"OTEL_TRACES_EXPORTER": "console"}},
		{"otlp-http", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}},
		{"otlp-grpc", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}},
		{"otlp,console", map[string]string{"OTEL_TRACES_EXPORTER": "otlp,console"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL",
				"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
				b.Setenv(k, "")
			}
			b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
			for k, v := range bc.env {
				b.Setenv(k, v)
			}
			ctx := context.Background()
			for b.Loop() {
				p, err := tracing.Setup(ctx, tracing.WithExporters(tracingotlp.Exporter(), tracingconsole.Exporter()), tracing.WithConsoleWriter(io.Discard))
				if err != nil {
					b.Fatal(err)
				}
				if err := p.Shutdown(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
