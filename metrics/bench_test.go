package metrics_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/phasegate/phasegate/metrics"
)

// BenchmarkSetup measures what Setup costs a daemon's start for each
// exporter list, side by side: "disabled" is the floor (no SDK), "none" the
// in-process Prometheus registry alone (the Go and process collectors, the
// resource, the exporter); the others add push exporters, which Shutdown
// flushes to a loopback server that answers 404.
func BenchmarkSetup(b *testing.B) {
	col := httptest.NewServer(http.NotFoundHandler())
	defer col.Close()
	for _, bc := range []struct {
		name string
		env  map[string]string
	}{
		{"disabled", map[string]string{"OTEL_SDK_DISABLED": "true"}},
		{"none", nil},
		{"console", map[string]string{"OTEL_METRICS_EXPORTER": "console"}},
		{"otlp-http", map[string]string{"OTEL_METRICS_EXPORTER": "otlp"}},
		{"otlp-grpc", map[string]string{"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL",
				"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
				b.Setenv(k, "")
			}
			b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
			for k, v := range bc.env {
				b.Setenv(k, v)
			}
			ctx := context.Background()
			for b.Loop() {
				p, err := metrics.Setup(ctx, metrics.WithConsoleWriter(io.Discard))
				if err != nil {
					b.Fatal(err)
				}
				_ = p.Shutdown(ctx) // the 404 is expected; the cost is what is measured
			}
		})
	}
}
