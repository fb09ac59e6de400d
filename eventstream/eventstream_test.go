package eventstream_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/eventstream"
	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/lifecycle"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func nop(context.Context, *lifecycle.Progress) error { return nil }

// stopped returns a lifecycle that started and drained: its log is complete.
func stopped(t *testing.T) *lifecycle.Lifecycle {
	t.Helper()
	lc := serving(t)
	if err := lc.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	return lc
}

// serving returns a started lifecycle, drained when the test ends.
func serving(t *testing.T) *lifecycle.Lifecycle {
	t.Helper()
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: nop},
		{Name: "listen", DependsOn: []string{"lock"}, Run: nop},
		{Name: "serve", DependsOn: []string{"listen"}, Run: nop},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Drain(context.Background()) })
	return lc
}

// follow collects what Client.Follow hands over.
func follow(ctx context.Context, c *eventstream.Client, url string, after uint64) ([]lifecycle.Event, error) {
	var got []lifecycle.Event
	err := c.Follow(ctx, url, after, func(e lifecycle.Event) error {
		got = append(got, e)
		return nil
	})
	return got, err
}

func TestHandlerAnswers(t *testing.T) {
	lc := stopped(t) // 10 events: starting, 3×2 phases, serving, draining, stopped
	srv := httptest.NewServer(eventstream.NewHandler(lc))
	defer srv.Close()
	n := len(lc.Events(0))
	tests := []struct {
		name       string
		method     string
		query      string
		lastID     string
		wantStatus int
		wantFirst  uint64 // first event's seq in the body, 0 for none
		wantBody   string // a substring, for errors
	}{
		{name: "the whole log", method: "GET", wantStatus: 200, wantFirst: 1},
		{name: "after a position", method: "GET", query: "?after=3", wantStatus: 200, wantFirst: 4},
		{name: "Last-Event-ID wins over after", method: "GET", query: "?after=5", lastID: "3", wantStatus: 200, wantFirst: 4},
		{name: "nothing after the final event", method: "GET", lastID: fmt.Sprint(n), wantStatus: 204},
		{name: "beyond the log", method: "GET", query: fmt.Sprintf("?after=%d", n+1), wantStatus: 400, wantBody: "starts again after a restart"},
		{name: "not a number", method: "GET", lastID: "x", wantStatus: 400, wantBody: `Last-Event-ID "x" is not an event sequence number`},
		{name: "head", method: "HEAD", wantStatus: 200},
		{name: "post", method: "POST", wantStatus: 405, wantBody: "method not allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, srv.URL+tc.query, nil)
			if tc.lastID != "" {
				req.Header.Set("Last-Event-ID", tc.lastID)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.wantStatus, body)
			}
			if !strings.Contains(string(body), tc.wantBody) {
				t.Fatalf("body %q does not contain %q", body, tc.wantBody)
			}
			switch tc.wantStatus {
			case 405:
				if got := resp.Header.Get("Allow"); got != "GET, HEAD" {
					t.Fatalf("Allow %q", got)
				}
			case 200:
				if ct, cc := resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"); ct != "text/event-stream" || cc != "no-store" {
					t.Fatalf("Content-Type %q, Cache-Control %q", ct, cc)
				}
				if resp.Header.Get(eventstream.StreamHeader) == "" {
					t.Fatalf("no %s header", eventstream.StreamHeader)
				}
			}
			if tc.method == "HEAD" && len(body) != 0 {
				t.Fatalf("HEAD has a body: %q", body)
			}
			if tc.wantFirst == 0 {
				return
			}
			// The body is the retry hint, the events in order as
			// id/event/data, and the end marker.
			var want strings.Builder
			want.WriteString("retry: 1000\n\n")
			for _, e := range lc.Events(tc.wantFirst - 1) {
				fmt.Fprintf(&want, "id: %d\nevent: %s\ndata: %s\n\n", e.Seq, e.Kind, mustJSON(t, e))
			}
			want.WriteString("event: end\ndata: {}\n\n")
			if string(body) != want.String() {
				t.Fatalf("body\n%s\nwant\n%s", body, want.String())
			}
		})
	}
}

func TestStreamIsLiveWithHeartbeatsAndEndsWhenTheClientLeaves(t *testing.T) {
	lc := serving(t)
	srv := httptest.NewServer(eventstream.NewHandler(lc, eventstream.WithHeartbeat(time.Millisecond)))
	defer srv.Close()
	// A broken stream fails the test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	last := len(lc.Events(0))
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"?after=4", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	expect := func(want string) {
		t.Helper()
		for lines.Scan() {
			if strings.HasPrefix(lines.Text(), want) {
				return
			}
		}
		t.Fatalf("stream ended before %q: %v", want, lines.Err())
	}
	expect(fmt.Sprintf("id: %d", last)) // history: serving, the last event so far
	expect(": heartbeat")
	lc.Warn("egress", "ip_forward is 0") // live
	expect(fmt.Sprintf("id: %d", last+1))
	expect("event: warning-set")
	cancel() // the handler's watcher ends with the request; leakcheck checks
}

func TestFollowReturnsEveryEventOnceThenNil(t *testing.T) {
	lc := serving(t)
	srv := httptest.NewTLSServer(eventstream.NewHandler(lc))
	defer srv.Close()
	done := make(chan struct{})
	var got []lifecycle.Event
	var err error
	go func() {
		defer close(done)
		got, err = follow(context.Background(), &eventstream.Client{HTTPClient: srv.Client()}, srv.URL, 0)
	}()
	lc.Warn("egress", "ip_forward is 0")
	if err := lc.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-done
	if err != nil {
		t.Fatal(err)
	}
	if want := lc.Events(0); !same(got, want) {
		t.Fatalf("followed\n%v\nlog\n%v", got, want)
	}
	// Following from the middle of a finished log, and from its end.
	got, err = follow(context.Background(), &eventstream.Client{HTTPClient: srv.Client()}, srv.URL, 4)
	if err != nil || !same(got, lc.Events(4)) {
		t.Fatalf("after 4: %v, %v", got, err)
	}
	last := uint64(len(lc.Events(0)))
	if got, err = follow(context.Background(), &eventstream.Client{HTTPClient: srv.Client()}, srv.URL, last); err != nil || len(got) != 0 {
		t.Fatalf("after the final event: %v, %v", got, err)
	}
}

// cutting serves the stream but ends each response after a number of
// events, the way a proxy restart or a network blip does: cleanly (the
// response ends early) or abruptly (the connection is torn down, possibly
// mid-event).
type cutting struct {
	h       http.Handler
	every   int  // events per connection
	abort   bool // tear the connection down instead of ending the response
	served  atomic.Int32
	connect atomic.Int32
}

func (c *cutting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.connect.Add(1)
	cw := &cutWriter{ResponseWriter: w, left: c.every, abort: c.abort}
	defer func() {
		if v := recover(); v != nil && v != errCut {
			panic(v)
		}
	}()
	c.h.ServeHTTP(cw, r)
}

var errCut = errors.New("cut")

type cutWriter struct {
	http.ResponseWriter
	left  int
	abort bool
}

func (w *cutWriter) Write(b []byte) (int, error) {
	if strings.HasPrefix(string(b), "id: ") {
		if w.left == 0 {
			if w.abort {
				// Half an event, then the connection goes.
				_, _ = w.ResponseWriter.Write(b[:len(b)/2])
				http.NewResponseController(w.ResponseWriter).Flush()
				panic(http.ErrAbortHandler)
			}
			return 0, errCut
		}
		w.left--
	}
	return w.ResponseWriter.Write(b)
}

func (w *cutWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func TestFollowResumesAcrossDroppedConnections(t *testing.T) {
	for _, abort := range []bool{false, true} {
		t.Run(fmt.Sprintf("abort=%v", abort), func(t *testing.T) {
			lc := stopped(t)
			cut := &cutting{h: eventstream.NewHandler(lc), every: 3, abort: abort}
			srv := httptest.NewServer(cut)
			defer srv.Close()
			got, err := follow(context.Background(), &eventstream.Client{}, srv.URL, 0)
			if err != nil {
				t.Fatal(err)
			}
			if want := lc.Events(0); !same(got, want) {
				t.Fatalf("followed\n%v\nlog\n%v", got, want)
			}
			if n := cut.connect.Load(); n < 4 {
				t.Fatalf("%d connections for 10 events cut every 3", n)
			}
		})
	}
}

// logSource serves a fixed log, possibly broken.
type logSource []lifecycle.Event

func (s logSource) Events(after uint64) []lifecycle.Event {
	for i, e := range s {
		if e.Seq > after {
			return s[i:]
		}
	}
	return nil
}

func (s logSource) WatchEvents(ctx context.Context, after uint64) <-chan lifecycle.Event {
	ch := make(chan lifecycle.Event)
	go func() {
		defer close(ch)
		for _, e := range s.Events(after) {
			select {
			case ch <- e:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

func TestFollowRefusesGapsAndRepeats(t *testing.T) {
	ev := func(seq uint64) lifecycle.Event {
		return lifecycle.Event{Seq: seq, Kind: lifecycle.EventWarningSet, Name: "w", Message: fmt.Sprint(seq)}
	}
	tests := []struct {
		name string
		log  logSource
		want eventstream.SequenceError
	}{
		{"a gap", logSource{ev(1), ev(2), ev(4)}, eventstream.SequenceError{Want: 3, Got: 4}},
		{"a repeat", logSource{ev(1), ev(2), ev(2)}, eventstream.SequenceError{Want: 3, Got: 2}},
		{"a late start", logSource{ev(2)}, eventstream.SequenceError{Want: 1, Got: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(eventstream.NewHandler(tc.log))
			defer srv.Close()
			got, err := follow(context.Background(), &eventstream.Client{}, srv.URL, 0)
			var se *eventstream.SequenceError
			if !errors.As(err, &se) || *se != tc.want {
				t.Fatalf("Follow = %v, want %v", err, &tc.want)
			}
			// What came before the break was handed over, nothing after.
			if uint64(len(got)) != tc.want.Want-1 {
				t.Fatalf("handed over %v before the break", got)
			}
		})
	}
}

func TestFollowNoticesARestartedProcess(t *testing.T) {
	before, after := stopped(t), stopped(t)
	var connections atomic.Int32
	first := &cutting{h: eventstream.NewHandler(before), every: 4}
	restarted := eventstream.NewHandler(after)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if connections.Add(1) == 1 {
			first.ServeHTTP(w, r)
			return
		}
		restarted.ServeHTTP(w, r)
	}))
	defer srv.Close()
	got, err := follow(context.Background(), &eventstream.Client{}, srv.URL, 0)
	if !errors.Is(err, eventstream.ErrStreamChanged) || len(got) != 4 {
		t.Fatalf("Follow = %v after %d events, want ErrStreamChanged after 4", err, len(got))
	}
}

func TestFollowErrors(t *testing.T) {
	t.Run("not found is final", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		defer srv.Close()
		_, err := follow(context.Background(), &eventstream.Client{}, srv.URL, 0)
		var se *eventstream.StatusError
		if !errors.As(err, &se) || se.StatusCode != 404 || se.Body != "404 page not found" {
			t.Fatalf("Follow = %v, want a 404 StatusError", err)
		}
	})
	t.Run("another content type is final", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "<html>") }))
		defer srv.Close()
		_, err := follow(context.Background(), &eventstream.Client{}, srv.URL, 0)
		var se *eventstream.StatusError
		if !errors.As(err, &se) || se.StatusCode != 200 {
			t.Fatalf("Follow = %v, want a StatusError", err)
		}
	})
	t.Run("a refused port is retried until ctx ends, and named", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close() // nothing listens there now
		ctx, cancel := context.WithTimeoutCause(context.Background(), 300*time.Millisecond, errors.New("test budget"))
		defer cancel()
		_, err := follow(ctx, &eventstream.Client{}, url, 0)
		if err == nil || !strings.Contains(err.Error(), "test budget") || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("Follow = %v, want ctx's cause and the refusal", err)
		}
	})
	t.Run("fn's error stops it", func(t *testing.T) {
		lc := stopped(t)
		srv := httptest.NewServer(eventstream.NewHandler(lc))
		defer srv.Close()
		stop := errors.New("seen enough")
		n := 0
		err := eventstream.Follow(context.Background(), srv.URL, 0, func(lifecycle.Event) error {
			if n++; n == 2 {
				return stop
			}
			return nil
		})
		if err != stop || n != 2 {
			t.Fatalf("Follow = %v after %d events", err, n)
		}
	})
}

func mustJSON(t *testing.T, e lifecycle.Event) string {
	t.Helper()
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// same compares events as they cross the wire: times keep their instant,
// not their monotonic reading or location.
func same(a, b []lifecycle.Event) bool {
	norm := func(es []lifecycle.Event) []lifecycle.Event {
		out := make([]lifecycle.Event, len(es))
		for i, e := range es {
			e.Time = e.Time.UTC().Round(0)
			out[i] = e
		}
		return out
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

// Close ends the streams of a lifecycle that has not ended: a follower gets
// every event recorded until then, then ErrClosed, at once (before, it
// waited for the final event, which comes after a draining server's port is
// gone, and held the drain up); a request after Close is answered 503.
func TestCloseEndsStreamsBeforeTheFinalEvent(t *testing.T) {
	lc := serving(t)
	h := eventstream.NewHandler(lc)
	srv := httptest.NewServer(h)
	defer srv.Close()

	got := make(chan []lifecycle.Event, 1)
	errc := make(chan error, 1)
	first := make(chan struct{})
	var once atomic.Bool
	go func() {
		var events []lifecycle.Event
		err := (&eventstream.Client{}).Follow(context.Background(), srv.URL, 0, func(e lifecycle.Event) error {
			events = append(events, e)
			if once.CompareAndSwap(false, true) {
				close(first)
			}
			return nil
		})
		got <- events
		errc <- err
	}()
	<-first
	lc.Warn("disk", "a warning recorded just before the close") // must still reach the follower
	h.Close()
	h.Close() // idempotent

	select {
	case err := <-errc:
		if !errors.Is(err, eventstream.ErrClosed) {
			t.Fatalf("Follow after Close: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Follow still running after Close: the stream waits for the final event")
	}
	events := <-got
	if want := lc.Events(0); !same(events, want) {
		t.Errorf("followed %d events, want the %d recorded before the close:\n%v\n%v", len(events), len(want), events, want)
	}

	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a request after Close: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// A stream whose lifecycle ends as the handler closes still ends with the
// final event and the end message, whichever the handler sees first, and
// Follow returns nil.
func TestCloseAsTheLifecycleEnds(t *testing.T) {
	for i := range 20 {
		lc := serving(t)
		h := eventstream.NewHandler(lc)
		srv := httptest.NewServer(h)
		first := make(chan struct{})
		var once atomic.Bool
		errc := make(chan error, 1)
		var events []lifecycle.Event
		go func() {
			errc <- (&eventstream.Client{}).Follow(context.Background(), srv.URL, 0, func(e lifecycle.Event) error {
				events = append(events, e)
				if once.CompareAndSwap(false, true) {
					close(first)
				}
				return nil
			})
		}()
		<-first
		if err := lc.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		h.Close()
		if err := <-errc; err != nil {
			t.Fatalf("round %d: Follow: %v, want nil (the final event was recorded before the close); got %v of %v", i, err, events, lc.Events(0))
		}
		if want := lc.Events(0); !same(events, want) {
			t.Fatalf("round %d: followed %d events, want %d", i, len(events), len(want))
		}
		srv.Close()
	}
}
