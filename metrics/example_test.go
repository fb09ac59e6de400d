package metrics_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/phasegate/phasegate/metrics"
	metricsconsole "github.com/phasegate/phasegate/metrics/console"
	metricsotlp "github.com/phasegate/phasegate/metrics/otlp"
	metricsprom "github.com/phasegate/phasegate/metrics/prometheus"
)

// Setup builds the meter provider; its handler serves /metrics on the
// daemon's own port whatever OTEL_METRICS_EXPORTER says ("prometheus" in
// the list opens no second port). Instruments declared once are pulled
// there and, with "otlp" or "console" in the list, pushed too.
func ExampleSetup() {
	os.Unsetenv("OTEL_SDK_DISABLED")
	os.Setenv("OTEL_METRICS_EXPORTER", "prometheus")
	defer os.Unsetenv("OTEL_METRICS_EXPORTER")

	ctx := context.Background()
	mp, err := metrics.Setup(ctx, metrics.WithExporters(metricsotlp.Exporter(), metricsconsole.Exporter(), metricsprom.Exporter()), metrics.WithServiceName("node-agent"), metrics.WithVersion("v0.1.0"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mp.Shutdown(ctx)
	checks, err := metrics.NewHealthChecks(mp)
	if err != nil {
		fmt.Println(err)
		return
	}
	checks.HTTP("/readyz", http.StatusOK)

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", mp.Handler())
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for line := range strings.Lines(w.Body.String()) {
		if strings.HasPrefix(line, "phasegate_health_checks_total") {
			fmt.Print(line)
		}
	}
	fmt.Println(mp.Exporters, mp.OTLP)
	// Output:
	// phasegate_health_checks_total{dialect="readyz",result="pass"} 1
	// [prometheus] false
}
