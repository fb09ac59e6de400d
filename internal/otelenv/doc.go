// Package otelenv reads the OTEL_* variables tracing and metrics share,
// and chooses and opens the exporters they name.
//
// It holds what the two packages' Setup functions share.
//
// It reads OTEL_SDK_DISABLED, the exporter lists in OTEL_TRACES_EXPORTER and
// OTEL_METRICS_EXPORTER, and the OTLP protocol; a [Signal] chooses among
// the exporters a binary was given those its variable names, and [Open]
// opens them, stopping the opened ones when one fails. The two signals'
// exporter and pipeline types stay their own packages': a tracing exporter
// is not a metrics one. It imports no part of the SDK: tracing and
// metrics read the environment whether or not an exporter, and with it
// the SDK, is linked (the resource is in otelsdk).
//
// It is stricter than the specification asks: a value it does not know is
// an error naming the variable, never a warning followed by a default, so a
// typo cannot silently turn telemetry off (or on). Names and protocols are
// case-insensitive and may be padded with spaces.
//
// The contrib package go.opentelemetry.io/contrib/exporters/autoexport
// (v0.72.0) was measured as a replacement and left out: it takes
// OTEL_*_EXPORTER as one name, so "otlp,console" is an unknown exporter
// (open-telemetry/opentelemetry-go-contrib#4471), it ignores
// OTEL_SDK_DISABLED, its console exporters write to stdout only, and its
// "prometheus" reader serves a second registry on a port of its own.
// tracing/internal/autoexportcmp holds the comparison.
package otelenv
