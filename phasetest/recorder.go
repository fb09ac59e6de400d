package phasetest

import (
	"context"
	"fmt"
	"sync"

	"github.com/phasegate/phasegate/internal/eventlog"
	"github.com/phasegate/phasegate/lifecycle"
)

// Source is a lifecycle's event log that a test can wait on:
// *lifecycle.Lifecycle, [*Harness], [*Recorder] and [*Stream] are all one.
type Source interface {
	// WatchEvents yields the events numbered after after, then new ones as
	// they come, and closes after the last one or when ctx ends.
	WatchEvents(ctx context.Context, after uint64) <-chan lifecycle.Event
}

// Recorder keeps the events it is handed, in order, for assertions and
// waits: pass its Record method to [lifecycle.WithEventHook] to record a
// lifecycle from the inside. It expects the whole log, from event 1, each
// event once: Record notes a gap or a repeat, and [Recorder.Err] reports it.
// The zero value is ready to use; it is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	events []lifecycle.Event
	err    error         // the first event out of sequence, or why recording ended
	ended  bool          // no event will follow
	reason string        // why recording ended without the final event, when it ended well
	wake   eventlog.Wake // readers waiting for the next change
}

// Record appends e. It is a [lifecycle.WithEventHook] hook.
func (r *Recorder) Record(e lifecycle.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if want := uint64(len(r.events)) + 1; e.Seq != want && r.err == nil {
		r.err = fmt.Errorf("phasetest: recorded event %d where %d was due", e.Seq, want)
	}
	r.events = append(r.events, e)
	if e.Final() {
		r.ended = true
	}
	r.wake.Signal()
}

// end marks the recording over, with the reason when it ended badly.
func (r *Recorder) end(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
	r.ended = true
	r.wake.Signal()
}

// endBecause marks the recording over before the final event for a reason
// that is not a failure, which waits that cannot be met report.
func (r *Recorder) endBecause(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reason = reason
	r.ended = true
	r.wake.Signal()
}

// Events returns a copy of the events recorded after the one numbered
// after: Events(0) is all of them.
func (r *Recorder) Events(after uint64) []lifecycle.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	if after >= uint64(len(r.events)) {
		return nil
	}
	return append([]lifecycle.Event(nil), r.events[after:]...)
}

// Err returns the first problem with the recording: an event out of
// sequence, or for a [Stream] why following it failed. Nil means every
// event so far arrived once and in order.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// WatchEvents yields the recorded events after after, then each new one,
// and closes after the final event, when the recording ends, or when ctx
// ends. It makes a Recorder a [Source].
func (r *Recorder) WatchEvents(ctx context.Context, after uint64) <-chan lifecycle.Event {
	// A position in the slice, not a Seq: a broken recording is still
	// replayed whole, for Err and the assertions to explain.
	return eventlog.Follow(ctx, after, r.since)
}

// since returns the recorded events after position after; with none, a
// channel closed at the next change, or ended when none will come.
// Recorded events are never changed, only appended after.
func (r *Recorder) since(after uint64) ([]lifecycle.Event, <-chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return eventlog.Since(r.events, after, r.ended, &r.wake)
}
