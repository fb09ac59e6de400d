// Package prometheus provides the "prometheus" metric exporter of package
// metrics.
//
// It is an in-process Prometheus registry holding every instrument and the
// Go runtime and process collectors, served in the text format by
// metrics.Provider.Handler (the App's /metrics). It is there whether or not
// OTEL_METRICS_EXPORTER lists it, and opens no port of its own:
// OTEL_EXPORTER_PROMETHEUS_HOST and _PORT are ignored. It is its own package
// so that a binary that serves no /metrics does not link the Prometheus
// client.
package prometheus
