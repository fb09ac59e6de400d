package metrics_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"

	"github.com/phasegate/phasegate/metrics"
	metricsconsole "github.com/phasegate/phasegate/metrics/console"
	metricsotlp "github.com/phasegate/phasegate/metrics/otlp"
	metricsprom "github.com/phasegate/phasegate/metrics/prometheus"
)

type grpcMetricsCollector struct {
	colmetricpb.UnimplementedMetricsServiceServer
}

func (grpcMetricsCollector) Export(context.Context, *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

// BenchmarkSetup measures what Setup and Shutdown cost a daemon for each
// exporter list, side by side: "disabled" is the floor (no SDK), "none" the
// in-process Prometheus registry alone (the Go and process collectors, the
// resource, the exporter); the others add push exporters, which Shutdown
// flushes once to an OTLP receiver on loopback.
func BenchmarkSetup(b *testing.B) {
	httpCol := newOTLPCollector(b)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	colmetricpb.RegisterMetricsServiceServer(gs, grpcMetricsCollector{})
	var wg sync.WaitGroup
	wg.Go(func() { _ = gs.Serve(lis) })
	defer func() { gs.Stop(); wg.Wait() }()
	for _, bc := range []struct {
		name string
		env  map[string]string
	}{
		{"disabled", map[string]string{"OTEL_SDK_DISABLED": "true"}},
		{"none", nil},
		{"console", map[string]string{"OTEL_METRICS_EXPORTER": "console"}},
		{"otlp-http", map[string]string{"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": httpCol.URL}},
		{"otlp-grpc", map[string]string{"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + lis.Addr().String(), "OTEL_EXPORTER_OTLP_INSECURE": "true"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL",
				"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
				"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_INSECURE"} {
				b.Setenv(k, "")
			}
			for k, v := range bc.env {
				b.Setenv(k, v)
			}
			ctx := context.Background()
			for b.Loop() {
				p, err := metrics.Setup(ctx, metrics.WithExporters(metricsotlp.Exporter(), metricsconsole.Exporter(), metricsprom.Exporter()), metrics.WithConsoleWriter(io.Discard))
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
