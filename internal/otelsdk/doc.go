// Package otelsdk holds what the OpenTelemetry SDK's providers share: the
// resource, built so that the environment wins over the code.
//
// Only the exporter packages (tracing/export, metrics/export and those
// built on them) import it: the SDK comes with an exporter, so a service
// that exports nothing does not link it.
package otelsdk
