package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/phasegate/phasegate/internal/eventlog"
)

// EventKind says what an [Event] is about.
type EventKind string

// Event kinds.
const (
	// EventLifecycle is the lifecycle moving between [State]s.
	EventLifecycle EventKind = "lifecycle"
	// EventPhase is a phase moving between [PhaseState]s.
	EventPhase EventKind = "phase"
	// EventTask is a background task (see [Progress.Defer]) starting, in
	// From "" To running, or ending.
	EventTask EventKind = "task"
	// EventWarningSet is a warning set or given a new message (see
	// [Lifecycle.Warn]).
	EventWarningSet EventKind = "warning-set"
	// EventWarningCleared is a warning cleared (see
	// [Lifecycle.ClearWarning]).
	EventWarningCleared EventKind = "warning-cleared"
)

// Event is one transition of a lifecycle, of one of its phases or background
// tasks, or of one of its warnings. The lifecycle records every such change
// as an Event, exactly once and in the order it happened: the phase events
// of a start appear in an order that respects the dependencies, since a
// phase's running is recorded only after each of its dependencies'
// succeeded. Progress reports are not events.
//
// The JSON field names are stable; fields that do not apply to an event's
// kind are left out.
type Event struct {
	// Seq numbers the lifecycle's events densely from 1: no two events
	// share one and none is skipped, so a reader that resumes after the
	// last Seq it saw, and finds the next one to be Seq+1, missed nothing.
	Seq uint64 `json:"seq"`
	// Time is when the transition happened.
	Time time.Time `json:"time"`
	// Kind says what changed.
	Kind EventKind `json:"kind"`
	// Name is the phase, task or warning; empty for lifecycle events.
	Name string `json:"name,omitempty"`
	// From and To are the states before and after: lifecycle [State]s,
	// [PhaseState]s or [TaskState]s, by Kind; compare them with the
	// constants as they are (e.To == PhaseSucceeded). A task's first event
	// has no From; warning events have neither (nil).
	From EventState `json:"from,omitempty"`
	To   EventState `json:"to,omitempty"`
	// Attempt is a phase's attempt, 1 for the first: the one that starts
	// running, that failed before a retry, or that ended the phase. Zero
	// for a skipped phase and for other kinds.
	Attempt int `json:"attempt,omitempty"`
	// Err is the error's text when the transition is a failure: a phase
	// attempt that failed (To retrying or failed), a phase cancelled (the
	// cause), a task that failed or was cancelled, the lifecycle failing.
	Err string `json:"error,omitempty"`
	// DependsOn is a phase's declared dependencies, on every phase event,
	// so that a reader can check from the events alone that each phase ran
	// only after its dependencies succeeded. Shared: do not modify.
	DependsOn []string `json:"depends_on,omitempty"`
	// Phase is the phase that deferred a task; task events only.
	Phase string `json:"phase,omitempty"`
	// Message is a warning's message: the new one for warning-set, the
	// one cleared for warning-cleared.
	Message string `json:"message,omitempty"`
}

// Final reports whether e is the lifecycle's last event: its entering
// stopped. Nothing is recorded after it.
func (e Event) Final() bool {
	return e.Kind == EventLifecycle && e.To == StateStopped
}

// UnmarshalJSON decodes an event as Event's JSON encodes it, From and To
// as the state type of its Kind.
func (e *Event) UnmarshalJSON(b []byte) error {
	type plain Event
	var v struct {
		plain
		From string `json:"from,omitempty"`
		To   string `json:"to,omitempty"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*e = Event(v.plain)
	e.From, e.To = EventStateOf(e.Kind, v.From), EventStateOf(e.Kind, v.To)
	return nil
}

// String renders e on one line for logs and test failures:
// "#7 phase reclaim running→retrying (attempt 1): device busy".
func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %s", e.Seq, e.Kind)
	if e.Name != "" {
		b.WriteString(" " + e.Name)
	}
	if e.To != nil {
		b.WriteString(" ")
		if e.From != nil {
			b.WriteString(e.From.String() + "→")
		}
		b.WriteString(e.To.String())
	}
	if e.Attempt > 0 {
		fmt.Fprintf(&b, " (attempt %d)", e.Attempt)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.Err != "" {
		b.WriteString(": " + e.Err)
	}
	return b.String()
}

// The event log. Events are appended under l.mu and never changed after, so
// a slice of the log taken under the lock can be read after it is released:
// appends write past its end, or into a new array.

// recordLocked appends e to the log, numbering it, and wakes whoever waits
// for events. After the final event nothing more is recorded (see
// finishEventsLocked).
func (l *Lifecycle) recordLocked(e Event) {
	if l.eventsDone {
		return
	}
	e.Seq = uint64(len(l.events)) + 1
	l.events = append(l.events, e)
	l.eventWake.Signal()
	if l.opts.hook != nil && !l.delivering {
		l.delivering = true
		go l.deliverEvents()
	}
}

// finishEventsLocked marks the log complete: no event will follow, and
// readers waiting for one are told so.
func (l *Lifecycle) finishEventsLocked() {
	l.eventsDone = true
	l.eventWake.Signal()
}

// deliverEvents hands the events the hook has not seen to it, one at a time
// and in order, until it has seen them all; recordLocked starts it when
// none is running, so the goroutine lives only while events wait. Only one runs at a time, so each event is handed over
// exactly once. It never holds the lock while the hook runs.
func (l *Lifecycle) deliverEvents() {
	l.mu.Lock()
	for l.delivered < len(l.events) {
		e := l.events[l.delivered]
		l.delivered++
		l.mu.Unlock()
		l.opts.hook(e)
		l.mu.Lock()
	}
	l.delivering = false
	l.mu.Unlock()
}

// Events returns a copy of the events recorded after the one numbered
// after, in order: Events(0) is the whole log so far. Once Start or Drain
// has returned, the log holds every event they caused.
//
// The log is kept for the lifecycle's life. Its length is bounded by the
// declaration: at most 4 lifecycle events, 2 per attempt of a phase (1 for a
// phase skipped), 2 per background task, plus one per Warn that changed a
// warning and one per ClearWarning that cleared one. Only warnings can grow
// it after the start, so a warning that comes and goes is what a
// long-lived daemon pays for it (sizes: docs/BENCHMARKS.md, "Lifecycle
// engine", the event log).
func (l *Lifecycle) Events(after uint64) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	if after >= uint64(len(l.events)) {
		return nil
	}
	out := make([]Event, len(l.events)-int(after))
	copy(out, l.events[after:])
	return out
}

// WatchEvents returns a channel that receives, in order, every event
// numbered after after, first those already recorded and then each new one
// as it happens: WatchEvents(ctx, 0) is the whole history, then live. It
// never drops an event: the channel is fed from the log by a goroutine that
// waits for the reader, so a slow reader only falls behind, and never slows
// the lifecycle.
//
// The channel is closed after the final event (the lifecycle stopped, see
// [Event.Final]) has been received, at once if it was received before, when
// ctx ends, or when the lifecycle was drained before it started and will
// record nothing more. The goroutine ends with it: cancel ctx to stop
// watching a lifecycle that has not stopped.
//
// A snapshot and WatchEvents(ctx, snapshot.EventSeq) together see every
// event exactly once: those before the snapshot in it, the rest on the
// channel.
func (l *Lifecycle) WatchEvents(ctx context.Context, after uint64) <-chan Event {
	// A position in the log is its last event's Seq: events are numbered
	// from 1 with no gap.
	return eventlog.Follow(ctx, after, l.eventsSince)
}

// eventsSince returns the events after after, sharing the log's array (see
// the comment above recordLocked). When there are none it returns a channel
// closed at the next event, or done when there will be none.
func (l *Lifecycle) eventsSince(after uint64) (batch []Event, wake <-chan struct{}, done bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return eventlog.Since(l.events, after, l.eventsDone, &l.eventWake)
}
