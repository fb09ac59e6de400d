package prometheus

import (
	"context"

	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"

	"github.com/phasegate/phasegate/metrics"
)

// Exporter returns the "prometheus" exporter, for [metrics.WithExporters]
// or app.Config.MetricExporters.
func Exporter() metrics.Exporter {
	return metrics.Exporter{Name: metrics.ExporterPrometheus, Always: true, New: newExporter}
}

func newExporter(_ context.Context, s metrics.ExportSettings) (metrics.Export, error) {
	reg := promclient.NewRegistry()
	x := metrics.Export{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})}
	if s.Disabled {
		return x, nil // an empty registry: the scraper sees the target up
	}
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return metrics.Export{}, err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return metrics.Export{}, err
	}
	reader, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
		otelprom.WithoutScopeInfo(),
	)
	if err != nil {
		return metrics.Export{}, err
	}
	x.Reader = reader
	return x, nil
}
