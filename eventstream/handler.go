package eventstream

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// Source is the event log a [Handler] serves; *lifecycle.Lifecycle is one.
type Source interface {
	// Events returns the events numbered after after.
	Events(after uint64) []lifecycle.Event
	// WatchEvents yields the events numbered after after, then new ones,
	// and closes after the final one or when ctx ends.
	WatchEvents(ctx context.Context, after uint64) <-chan lifecycle.Event
}

// StreamHeader is the response header that names the log a [Handler]
// serves. It is drawn at random when the handler is made, so a client that
// reconnects to a restarted process — a new lifecycle whose sequence numbers
// start again from 1 — sees that it changed instead of resuming in the
// wrong log.
const StreamHeader = "Phasegate-Stream"

// EndEvent is the SSE event type of the message a [Handler] sends after the
// lifecycle's last event. It has no id, so it does not move a client's
// Last-Event-ID; a client that gets it stops, one that reconnects anyway is
// answered 204 No Content, which tells an EventSource to stop.
const EndEvent = "end"

// ClosedEvent is the SSE event type of the message a [Handler] sends when
// it is closed before the lifecycle's last event: the process is stopping
// (or handing its port to a new one) and the port closes before the rest of
// the log is written. The events recorded until then were sent first. A
// [Client] that gets it returns [ErrClosed].
const ClosedEvent = "closed"

// Defaults of a [Handler].
const (
	// DefaultHeartbeat is how often an idle stream gets a comment line, so
	// that proxies and load balancers do not close it for inactivity and a
	// client can tell a quiet lifecycle from a dead connection.
	DefaultHeartbeat = 15 * time.Second
	// writeTimeout bounds each write to the client: one that stops reading
	// has its stream ended instead of holding a goroutine for ever. It is
	// set per write, so it also lifts an http.Server's WriteTimeout, which
	// would otherwise cut every stream after that long.
	writeTimeout = time.Minute
	// retryMillis is the reconnection delay the stream suggests to
	// EventSource clients.
	retryMillis = 1000
)

// Handler serves one lifecycle's events as a text/event-stream. Make it with
// [NewHandler]; it answers GET and HEAD and is safe for concurrent use. Serve
// each lifecycle with one Handler: its [StreamHeader] identifies the log.
type Handler struct {
	src       Source
	heartbeat time.Duration
	stream    string
	closing   chan struct{}
	closeOnce sync.Once
}

// An Option configures a [Handler].
type Option func(*Handler)

// WithHeartbeat sets how often an idle stream gets a comment line; without
// it the interval is [DefaultHeartbeat]. Zero sends none.
func WithHeartbeat(d time.Duration) Option {
	return func(h *Handler) { h.heartbeat = max(d, 0) }
}

// NewHandler returns a handler that serves src's events.
func NewHandler(src Source, opts ...Option) *Handler {
	h := &Handler{src: src, heartbeat: DefaultHeartbeat, stream: rand.Text(), closing: make(chan struct{})}
	for _, opt := range opts {
		opt(h)
	}
	return h
}

// Close ends every stream: each is sent the events recorded so far and
// then a [ClosedEvent] message. Requests after Close are answered 503. A
// server that drains calls it as it stops taking requests (server.Server's
// OnShutdown), since a stream otherwise lasts until the lifecycle's final
// event, which comes after the port is gone: the drain would wait for it
// to the end of its stop timeout. Close is idempotent.
func (h *Handler) Close() { h.closeOnce.Do(func() { close(h.closing) }) }

// ServeHTTP streams the events numbered after the request's Last-Event-ID
// header or, without one, its after query parameter (zero: the whole log).
// It answers 204 No Content to a request for what comes after the final
// event, 400 to a malformed position or to one past the end of the log (a
// client of another lifecycle), and 405 to methods other than GET and HEAD.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	after, err := position(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	select {
	case <-h.closing:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "the process is stopping", http.StatusServiceUnavailable)
		return
	default:
	}
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	hdr.Set(StreamHeader, h.stream)
	if after > 0 {
		// The event the client last saw must exist; when it is the final
		// one there is nothing more to send.
		last := h.src.Events(after - 1)
		switch {
		case len(last) == 0:
			http.Error(w, fmt.Sprintf("no event %d in this stream: it starts again after a restart", after), http.StatusBadRequest)
			return
		case len(last) == 1 && last[0].Final():
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("X-Accel-Buffering", "no") // nginx: pass each event on at once
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	h.serve(r.Context(), w, after)
}

// serve writes events until the log ends or the client goes.
func (h *Handler) serve(ctx context.Context, w http.ResponseWriter, after uint64) {
	rc := http.NewResponseController(w)
	write := func(b []byte) bool {
		// Not every ResponseWriter can set deadlines; it then has none.
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the watcher when a write fails
	events := h.src.WatchEvents(ctx, after)

	var tick <-chan time.Time
	if h.heartbeat > 0 {
		t := time.NewTicker(h.heartbeat)
		defer t.Stop()
		tick = t.C
	}
	if !write([]byte("retry: " + strconv.Itoa(retryMillis) + "\n\n")) {
		return
	}
	buf := make([]byte, 0, 512)
	sent, final := after, false // the last event written, and whether it was the final one
	for {
		select {
		case <-h.closing:
			// What the log holds now, then the close: the channel may
			// not have yielded the latest events yet.
			for _, e := range h.src.Events(sent) {
				if final || !write(appendEvent(buf[:0], e)) {
					break
				}
				sent, final = e.Seq, e.Final()
			}
			if final {
				write([]byte(endMessage))
			} else {
				write([]byte(closedMessage))
			}
			return
		case e, ok := <-events:
			if !ok {
				if ctx.Err() == nil { // the log ended, not the client
					write([]byte(endMessage))
				}
				return
			}
			buf = appendEvent(buf[:0], e)
			if !write(buf) {
				return
			}
			sent, final = e.Seq, e.Final()
		case <-tick:
			if !write([]byte(": heartbeat\n\n")) {
				return
			}
		}
	}
}

// The messages that end a stream. Browsers dispatch only messages with
// data.
const (
	endMessage    = "event: " + EndEvent + "\ndata: {}\n\n"
	closedMessage = "event: " + ClosedEvent + "\ndata: {}\n\n"
)

// appendEvent appends e as one SSE message. JSON has no raw newlines, so the
// data is a single line.
func appendEvent(b []byte, e lifecycle.Event) []byte {
	b = append(b, "id: "...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, "\nevent: "...)
	b = append(b, e.Kind...)
	b = append(b, "\ndata: "...)
	data, err := json.Marshal(e)
	if err != nil {
		// An Event has only strings, numbers and a time: it always encodes.
		panic(fmt.Sprintf("eventstream: encoding event %d: %v", e.Seq, err))
	}
	b = append(b, data...)
	return append(b, "\n\n"...)
}

// position reads where the client wants to resume: Last-Event-ID, which
// EventSource sends when it reconnects, wins over ?after=.
func position(r *http.Request) (uint64, error) {
	name, v := "Last-Event-ID", r.Header.Get("Last-Event-ID")
	if v == "" {
		name, v = "after", r.URL.Query().Get("after")
	}
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s %q is not an event sequence number", name, v)
	}
	return n, nil
}
