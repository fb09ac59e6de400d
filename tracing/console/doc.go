// Package console provides the "console" span exporter of package tracing.
//
// It writes spans as JSON to the writer given by tracing.WithConsoleWriter
// (stderr by default). It is its own package so that a binary that does not
// print spans does not link the stdout exporter.
package console
