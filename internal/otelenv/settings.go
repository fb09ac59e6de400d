package otelenv

import (
	"io"
	"os"
)

// Settings is what the options of tracing's and metrics' Setup set, for
// exporters of type E: the two packages' options are the same four, and
// this is their one home.
type Settings[E any] struct {
	// ServiceName is service.name when OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES do not set it; Version is service.version.
	ServiceName, Version string
	// Console is where a console exporter writes.
	Console io.Writer
	// Exporters are those the environment may name, in the order given.
	Exporters []E
}

// Apply returns the defaults (service "phasegate", the console on
// stderr) adjusted by opts in order.
func Apply[E any, O ~func(*Settings[E])](opts []O) Settings[E] {
	s := Settings[E]{ServiceName: "phasegate", Console: os.Stderr}
	for _, o := range opts {
		o(&s)
	}
	return s
}

// WithExporters adds e to the exporters given.
func WithExporters[E any](e []E) func(*Settings[E]) {
	return func(s *Settings[E]) { s.Exporters = append(s.Exporters, e...) }
}

// WithServiceName sets the service name.
func WithServiceName[E any](name string) func(*Settings[E]) {
	return func(s *Settings[E]) { s.ServiceName = name }
}

// WithVersion sets the service's version.
func WithVersion[E any](v string) func(*Settings[E]) {
	return func(s *Settings[E]) { s.Version = v }
}

// WithConsoleWriter sets where a console exporter writes.
func WithConsoleWriter[E any](w io.Writer) func(*Settings[E]) {
	return func(s *Settings[E]) { s.Console = w }
}

// Given indexes the exporters given by their name (a later one of a name
// replaces an earlier one) and lists their names in the order given.
func (s Settings[E]) Given(name func(E) string) (byName map[string]E, names []string) {
	byName = map[string]E{}
	for _, e := range s.Exporters {
		byName[name(e)] = e
		names = append(names, name(e))
	}
	return byName, names
}
