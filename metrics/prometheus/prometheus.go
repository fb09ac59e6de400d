package prometheus

import (
	"context"
	"net/http"

	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/metrics/export"
)

// Exporter returns the "prometheus" exporter, for [metrics.WithExporters]
// or app.Config.MetricExporters.
func Exporter() metrics.Exporter {
	return export.Pull(metrics.ExporterPrometheus, open)
}

func open(_ context.Context, s metrics.ExportSettings) (sdkmetric.Reader, http.Handler, error) {
	reg := promclient.NewRegistry()
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	if s.Disabled {
		return nil, h, nil // an empty registry: the scraper sees the target up
	}
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, nil, err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, nil, err
	}
	reader, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
		otelprom.WithoutScopeInfo(),
	)
	if err != nil {
		return nil, nil, err
	}
	return reader, h, nil
}
