package phasetest

import (
	"context"
	"fmt"
	"sync"

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
	wake   chan struct{} // closed at the next change; nil while nobody waits
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
	r.wakeLocked()
}

// end marks the recording over, with the reason when it ended badly.
func (r *Recorder) end(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
	r.ended = true
	r.wakeLocked()
}

// endBecause marks the recording over before the final event for a reason
// that is not a failure, which waits that cannot be met report.
func (r *Recorder) endBecause(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reason = reason
	r.ended = true
	r.wakeLocked()
}

func (r *Recorder) wakeLocked() {
	if r.wake != nil {
		close(r.wake)
		r.wake = nil
	}
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
	ch := make(chan lifecycle.Event)
	go func() {
		defer close(ch)
		for {
			// A position in the slice, not a Seq: a broken recording is
			// still replayed whole, for Err and the assertions to explain.
			batch, wake, ended := r.since(after)
			for _, e := range batch {
				select {
				case ch <- e:
					after++
				case <-ctx.Done():
					return
				}
			}
			switch {
			case len(batch) > 0:
				continue
			case ended:
				return
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

func (r *Recorder) since(after uint64) ([]lifecycle.Event, <-chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := uint64(len(r.events)); after < n {
		// Recorded events are never changed, only appended after.
		return r.events[after:n:n], nil, false
	}
	if r.ended {
		return nil, nil, true
	}
	if r.wake == nil {
		r.wake = make(chan struct{})
	}
	return nil, r.wake, false
}
