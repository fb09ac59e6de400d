package phasetest

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/phasegate/phasegate/eventstream"
	"github.com/phasegate/phasegate/lifecycle"
)

// Stream is a running process's lifecycle, followed through its event stream
// (see package eventstream) from the test's start to its end or the
// lifecycle's final event. It is a [Source], so [WaitState] and
// [WaitPhase] wait on it, and Events(0) gives the log to the assertions.
type Stream struct {
	rec    Recorder
	cancel context.CancelFunc
	done   chan struct{}
}

// FollowOption configures [Follow].
type FollowOption func(*eventstream.Client)

// WithHTTPClient makes [Follow] use c, for an https URL or a custom
// transport.
func WithHTTPClient(c *http.Client) FollowOption {
	return func(cl *eventstream.Client) { cl.HTTPClient = c }
}

// Follow starts following the event stream at url, from its first event,
// in the background: it reconnects and resumes whenever the connection drops
// or cannot be made yet (a process still binding its port), until the
// lifecycle's final event, [Stream.Close] or the end of the test. A gap or a
// repeat in the stream, or an answer that is not a stream, ends the
// following; the waits then fail saying so, and so does the test at cleanup.
//
// A process that drains closes its stream as its port stops taking requests
// ([eventstream.ErrClosed]): the following then ends, not as a failure, with
// the events up to the port's drain; what happens after (the other phases'
// stops) cannot reach the test through the port. Wait for the process to
// exit instead.
func Follow(t testing.TB, url string, opts ...FollowOption) *Stream {
	t.Helper()
	var c eventstream.Client
	for _, opt := range opts {
		opt(&c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Stream{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		err := c.Follow(ctx, url, 0, func(e lifecycle.Event) error {
			s.rec.Record(e)
			return nil
		})
		switch {
		case errors.Is(err, eventstream.ErrClosed):
			s.rec.endBecause("the process closed its event stream as it stopped")
			return
		case ctx.Err() != nil && errors.Is(err, context.Canceled):
			err = nil // the test is over, or Close: not a failure of the stream
		}
		s.rec.end(err)
	}()
	t.Cleanup(func() {
		s.Close()
		if err := s.rec.Err(); err != nil {
			t.Errorf("phasetest: following %s: %v", url, err)
		}
	})
	return s
}

// Close stops following and returns once it has; the events received stay
// for the assertions and waits, which see the log end there. Close is
// idempotent; the test's end calls it.
func (s *Stream) Close() {
	s.cancel()
	<-s.done
}

// Events returns a copy of the events received after the one numbered
// after: Events(0) is all of them so far.
func (s *Stream) Events(after uint64) []lifecycle.Event { return s.rec.Events(after) }

// WatchEvents yields the events received after after, then each new one, and
// closes after the final event, when following ends, or when ctx ends.
func (s *Stream) WatchEvents(ctx context.Context, after uint64) <-chan lifecycle.Event {
	return s.rec.WatchEvents(ctx, after)
}

// Err returns why following failed — a gap, a restarted process, an answer
// that is not a stream — or nil while all is well.
func (s *Stream) Err() error { return s.rec.Err() }

func (s *Stream) recording() *Recorder   { return &s.rec }
func (r *Recorder) recording() *Recorder { return r }
