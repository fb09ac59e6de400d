package lifecycle

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Span attribute keys. They are part of what operators query in a trace
// store, so they change only with care.
const (
	attrPhase         = attribute.Key("phasegate.phase")
	attrDependsOn     = attribute.Key("phasegate.phase.depends_on")
	attrAttempts      = attribute.Key("phasegate.phase.attempts")
	attrAttempt       = attribute.Key("phasegate.attempt")
	attrBackoff       = attribute.Key("phasegate.backoff")
	attrError         = attribute.Key("error.message")
	attrProgressDone  = attribute.Key("phasegate.progress.done")
	attrProgressTotal = attribute.Key("phasegate.progress.total")
	attrOutcome       = attribute.Key("phasegate.outcome")
	attrTask          = attribute.Key("phasegate.task")
	attrPhaseCount    = attribute.Key("phasegate.phases")
)

// recordOutcome marks span as failed when err is not nil.
func recordOutcome(span trace.Span, err error) {
	if err == nil {
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}
