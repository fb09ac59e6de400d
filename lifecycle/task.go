package lifecycle

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// task is a background job handed off by a phase. Fields are guarded by
// Lifecycle.mu, except progress which is atomic.
type task struct {
	name     string
	phase    string
	state    TaskState
	started  time.Time
	ended    time.Time
	err      error
	progress Progress
	done     chan struct{} // closed when the task has returned and its end is recorded
}

// startTaskLocked launches a deferred task; the lifecycle owns its goroutine,
// cancels it through tasksCtx and waits for it through done.
func (l *Lifecycle) startTaskLocked(r *phaseRun, d deferredTask) {
	t := &task{name: d.name, phase: r.Name, state: TaskRunning, started: time.Now(), done: make(chan struct{})}
	t.progress.lc = l
	l.tasks = append(l.tasks, t)
	l.recordLocked(Event{Time: t.started, Kind: EventTask, Name: t.name, To: TaskRunning, Phase: t.phase})
	l.publishLocked()

	// A task outlives the startup trace, so it is a root span of its own,
	// linked to the phase that deferred it.
	ctx, span := l.tracer.Start(l.tasksCtx, "task "+d.name,
		trace.WithNewRoot(),
		trace.WithLinks(trace.Link{SpanContext: r.spanCtx}),
		trace.WithAttributes(attrTask.String(d.name), attrPhase.String(r.Name)),
	)
	go func() {
		defer close(t.done)
		err := runTask(ctx, d.fn, &t.progress)

		l.mu.Lock()
		t.ended = time.Now()
		t.err = err
		switch {
		case err == nil:
			t.state = TaskSucceeded
		case ctx.Err() != nil:
			t.state = TaskCancelled
		default:
			t.state = TaskFailed
			l.degraded = true
		}
		state, took := t.state, t.ended.Sub(t.started)
		prog := t.progress.snapshot()
		e := Event{Time: t.ended, Kind: EventTask, Name: t.name, From: TaskRunning, To: state, Phase: t.phase}
		if err != nil {
			e.Err = err.Error()
		}
		// After a drain that gave up waiting for it (its ctx ended), the
		// lifecycle has stopped and records nothing more: the task's end
		// shows in snapshots only.
		l.recordLocked(e)
		l.publishLocked()
		l.mu.Unlock()

		span.SetAttributes(
			attrOutcome.String(string(state)),
			attrProgressDone.Int64(prog.Done),
			attrProgressTotal.Int64(prog.Total),
		)
		if f := l.opts.spanAttributes; f != nil && span.IsRecording() {
			span.SetAttributes(f(SpanEnd{Name: t.name, Task: true, Took: took})...)
		}
		if state == TaskFailed {
			recordOutcome(span, err)
		}
		span.End()
	}()
}

func runTask(ctx context.Context, fn func(context.Context, *Progress) error, p *Progress) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = recovered(v)
		}
	}()
	return fn(ctx, p)
}
