package otelenv

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// OTLP is the exporter name of the OpenTelemetry protocol, whose
// protocol [Protocol] reads.
const OTLP = "otlp"

// A Signal is what tracing and metrics each read of the environment to
// choose their exporters.
type Signal struct {
	// Name is the signal as the variables spell it: "TRACES" or "METRICS".
	Name string
	// Package is this module's package of the signal ("tracing"), under
	// which each exporter it knows has a package of its own; Field is the
	// app.Config field an App is given them in ("TraceExporters").
	Package, Field string
}

// Var is the variable that lists the signal's exporters:
// OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER.
func (s Signal) Var() string { return "OTEL_" + s.Name + "_EXPORTER" }

// Choose reads the signal's exporter list ([Exporters]) among the names
// the specification knows and those of the exporters given, in order, and
// the OTLP protocol when the list names [OTLP]. A name the binary was not
// given is a [NotLinked] error: a typo or a missing exporter must not
// silently drop telemetry.
func (s Signal) Choose(known, given []string) (names []string, protocol string, err error) {
	if names, err = Exporters(s.Var(), slices.Concat(known, given)...); err != nil {
		return nil, "", err
	}
	for _, name := range names {
		if !slices.Contains(given, name) {
			return nil, "", NotLinked(s.Var(), name, s.Package+"/"+name, s.Field)
		}
	}
	if slices.Contains(names, OTLP) {
		if protocol, err = Protocol(s.Name); err != nil {
			return nil, "", err
		}
	}
	return names, protocol, nil
}

// A Pipeline is an opened exporter of either signal, as far as choosing
// them goes: it can be stopped when it will not be joined.
type Pipeline interface {
	Shutdown(ctx context.Context) error
}

// Open opens the exporters names, in order, with open; when one fails, it
// stops those it opened and returns the error, naming the exporter.
func Open[P Pipeline](ctx context.Context, names []string, open func(name string) (P, error)) ([]P, error) {
	var opened []P
	for _, name := range names {
		p, err := open(name)
		if err != nil {
			return nil, fmt.Errorf("%s exporter: %w", name, Shutdown(ctx, opened, err))
		}
		opened = append(opened, p)
	}
	return opened, nil
}

// Shutdown stops pipelines that will not be joined, and returns err with
// whatever that failed with.
func Shutdown[P Pipeline](ctx context.Context, ps []P, err error) error {
	for _, p := range ps {
		err = errors.Join(err, p.Shutdown(ctx))
	}
	return err
}
