package eventstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// ErrStreamChanged is returned by [Client.Follow] when a reconnection reaches
// a different stream than the first connection did (see [StreamHeader]): the
// process serving it restarted, and the lifecycle being followed is gone
// without its final event.
var ErrStreamChanged = errors.New("eventstream: the stream changed between connections: the serving process restarted")

// ErrClosed is returned by [Client.Follow] when the serving process closed
// the stream before the lifecycle's final event (a [ClosedEvent]): it is
// stopping, or handing its port to a new process, and its port closes
// before the rest of the log can be sent. Every event recorded until then
// was given to fn.
var ErrClosed = errors.New("eventstream: the serving process closed the stream before the lifecycle's final event: it is stopping")

// SequenceError reports an event whose sequence number is not the one after
// the last event received: events were lost (Got > Want) or repeated
// (Got < Want). [Client.Follow] never skips over either.
type SequenceError struct {
	// Want is the sequence number expected, Got the one received.
	Want, Got uint64
}

func (e *SequenceError) Error() string {
	if e.Got > e.Want {
		return fmt.Sprintf("eventstream: events %d to %d missing: received %d next", e.Want, e.Got-1, e.Got)
	}
	return fmt.Sprintf("eventstream: event %d received again, want %d", e.Got, e.Want)
}

// StatusError is an answer that is not an event stream and that retrying
// will not change: a 4xx status, or a 200 of another content type (the URL
// names something else).
type StatusError struct {
	URL        string
	StatusCode int
	// Body is the start of the answer's body, which usually says why.
	Body string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("eventstream: GET %s: %d %s: %s", e.URL, e.StatusCode, http.StatusText(e.StatusCode), e.Body)
}

// Client timing. A failed connection is retried after a wait that doubles
// from minRetryWait to maxRetryWait; a connection that brought events and
// then dropped is resumed at once.
const (
	minRetryWait = 50 * time.Millisecond
	maxRetryWait = 5 * time.Second
	// idleTimeout is how long a stream may stay silent, no event and no
	// heartbeat, before the client gives up on the connection (a peer gone
	// without a FIN, a NAT that forgot it) and resumes on a new one: three
	// of the handler's default heartbeats.
	idleTimeout = 3 * DefaultHeartbeat
	// maxLine bounds one line of the stream: an event with a very long
	// error text still fits.
	maxLine = 1 << 20
)

// Client follows event streams served by a [Handler]. The zero value is
// ready to use.
type Client struct {
	// HTTPClient makes the requests; nil means http.DefaultClient. For an
	// https URL, give one whose Transport carries the TLS configuration.
	// A Timeout on it ends each connection after that long; the client
	// then resumes on a new one, so the events still arrive whole.
	HTTPClient *http.Client
}

// Follow is [Client.Follow] with the zero Client.
func Follow(ctx context.Context, url string, after uint64, fn func(lifecycle.Event) error) error {
	return (&Client{}).Follow(ctx, url, after, fn)
}

// Follow reads the event stream at url and calls fn with each event numbered
// after after, in order, each exactly once. When the connection drops, or
// cannot be made, it reconnects and resumes after the last event fn was
// given, as long as ctx lasts; every event must carry the sequence number
// after the previous one, and a gap or a repeat ends Follow with a
// [*SequenceError].
//
// Follow returns nil once the stream has ended after the lifecycle's final
// event; fn's error if fn returns one (Follow then stops); [ErrClosed] if
// the serving process closed the stream as it stopped; [ErrStreamChanged]
// if the serving process restarted; a [*StatusError] for an answer retrying
// will not change; or, when ctx ends first, an error wrapping ctx's cause
// that also says why the last failed connection failed, if one did.
func (c *Client) Follow(ctx context.Context, url string, after uint64, fn func(lifecycle.Event) error) error {
	f := follower{c: c, url: url, next: after + 1, fn: fn}
	wait := time.Duration(0)
	var last error
	for {
		progressed, err := f.connect(ctx)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return f.ended(ctx, last)
		case !retryable(err):
			return err
		}
		last = err
		if progressed {
			wait = 0
		} else {
			wait = min(max(2*wait, minRetryWait), maxRetryWait)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return f.ended(ctx, last)
		}
	}
}

// ended explains a Follow that ctx ended, with the last connection's
// failure when there was one: "connection refused" says more than
// "deadline exceeded".
func (f *follower) ended(ctx context.Context, last error) error {
	if last == nil {
		return fmt.Errorf("eventstream: following %s: %w", f.url, context.Cause(ctx))
	}
	return fmt.Errorf("eventstream: following %s: %w (last failure: %v)", f.url, context.Cause(ctx), last)
}

// follower is the state of one Follow call across its connections.
type follower struct {
	c      *Client
	url    string
	next   uint64 // the sequence number expected next
	stream string // StreamHeader of the first answer
	fn     func(lifecycle.Event) error
}

// transientError marks a failure that a new connection may not have.
type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

func retryable(err error) bool {
	var t *transientError
	return errors.As(err, &t)
}

// connect makes one connection and reads it to its end. It returns nil when
// the stream is over, and whether any event arrived.
func (f *follower) connect(ctx context.Context) (progressed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.url, nil)
	if err != nil {
		return false, fmt.Errorf("eventstream: %w", err)
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Cache-Control", "no-store")
	if f.next > 1 {
		req.Header.Set("Last-Event-ID", strconv.FormatUint(f.next-1, 10))
	}
	hc := f.c.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, &transientError{err}
	}
	defer resp.Body.Close()

	if s := resp.Header.Get(StreamHeader); s != "" && resp.StatusCode < 300 {
		switch {
		case f.stream == "":
			f.stream = s
		case s != f.stream:
			return false, ErrStreamChanged
		}
	}
	switch code := resp.StatusCode; {
	case code == http.StatusNoContent:
		return false, nil // nothing after the final event
	case code == http.StatusOK:
		if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct != "text/event-stream" {
			return false, f.statusError(resp)
		}
	case code >= 500, code == http.StatusRequestTimeout, code == http.StatusTooManyRequests:
		return false, &transientError{f.statusError(resp)}
	default:
		return false, f.statusError(resp)
	}

	// A silent connection is cancelled, and the read below then fails.
	idle := time.AfterFunc(idleTimeout, cancel)
	defer idle.Stop()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	var msg message
	for sc.Scan() {
		idle.Reset(idleTimeout)
		if !msg.add(sc.Bytes()) {
			continue
		}
		done, err := f.dispatch(&msg)
		switch {
		case err != nil:
			return progressed, err
		case done:
			return progressed, nil
		}
		progressed = progressed || msg.id != ""
		msg = message{}
	}
	err = sc.Err()
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return progressed, &transientError{fmt.Errorf("eventstream: stream from %s ended before its end: %w", f.url, err)}
}

// dispatch handles one complete message: an event, the end, or something
// this client does not know and skips.
func (f *follower) dispatch(m *message) (done bool, err error) {
	switch {
	case m.event == EndEvent:
		return true, nil
	case m.event == ClosedEvent:
		return false, ErrClosed
	case m.id == "" || !m.hasData:
		return false, nil // not an event of the log: the retry hint, say
	}
	var e lifecycle.Event
	if err := json.Unmarshal(m.data, &e); err != nil {
		return false, fmt.Errorf("eventstream: event %s: %w", m.id, err)
	}
	if m.id != strconv.FormatUint(e.Seq, 10) {
		return false, fmt.Errorf("eventstream: message id %s carries event %d", m.id, e.Seq)
	}
	if e.Seq != f.next {
		return false, &SequenceError{Want: f.next, Got: e.Seq}
	}
	if err := f.fn(e); err != nil {
		return false, err
	}
	f.next++
	return false, nil
}

func (f *follower) statusError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return &StatusError{URL: f.url, StatusCode: resp.StatusCode, Body: string(bytes.TrimSpace(body))}
}

// message gathers the fields of one SSE message, line by line, as the
// HTML Living Standard's event stream parsing describes: a blank line ends
// it, lines starting with a colon are comments, a field's value follows its
// colon and one optional space.
type message struct {
	id, event string
	data      []byte
	hasData   bool
}

// add takes one line and reports whether it ended the message.
func (m *message) add(line []byte) bool {
	if len(line) == 0 {
		return true
	}
	if line[0] == ':' {
		return false
	}
	name, value, _ := bytes.Cut(line, []byte(":"))
	value = bytes.TrimPrefix(value, []byte(" "))
	switch string(name) {
	case "id":
		m.id = string(value)
	case "event":
		m.event = string(value)
	case "data":
		if m.hasData {
			m.data = append(m.data, '\n')
		}
		m.data = append(m.data, value...)
		m.hasData = true
	}
	return false
}
