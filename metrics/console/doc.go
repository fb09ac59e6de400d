// Package console provides the "console" metric exporter of package metrics.
//
// It pushes every metric as JSON to the writer given by
// metrics.WithConsoleWriter (stderr by default). It is its own package so
// that a binary that does not print metrics does not link the stdout
// exporter.
package console
