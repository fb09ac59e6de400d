package metrics

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// SlowSteps counts the steps of a start that took much longer than usual
// (the start history's verdict), in the counter phasegate.start.slow_steps
// by step and kind (phase or task). Its labels are bounded: a lifecycle's
// phases and tasks are declared.
type SlowSteps struct {
	counter metric.Int64Counter
}

// NewSlowSteps registers the counter on mp.
func NewSlowSteps(mp metric.MeterProvider) (*SlowSteps, error) {
	c, err := mp.Meter(scope).Int64Counter("phasegate.start.slow_steps",
		metric.WithDescription("Phases and background tasks of a start that took much longer than they usually do over the starts kept, by step and kind (phase, task)."))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return &SlowSteps{counter: c}, nil
}

// Add counts step name, a task when task is set, as slow once.
func (s *SlowSteps) Add(name string, task bool) {
	kind := "phase"
	if task {
		kind = "task"
	}
	s.counter.Add(context.Background(), 1, metric.WithAttributes(attribute.String("step", name), attribute.String("kind", kind)))
}
