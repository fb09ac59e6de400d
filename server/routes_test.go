package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/server"
)

// answer is what a real HTTP client got.
type answer struct {
	code  int
	body  string
	retry string // Retry-After
	close bool   // the server closes the connection
}

func getAnswer(t *testing.T, client *http.Client, url string) answer {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", url, err)
	}
	return answer{resp.StatusCode, string(body), resp.Header.Get("Retry-After"), resp.Close}
}

// A declared HTTP route answers 503 naming the phase and its progress
// until it is bound and the daemon serves, then its handler answers; from
// the moment the server drains it is 503 "draining" again, while ungated
// routes and health keep answering through the drain delay.
func TestGatedHTTPRoute(t *testing.T) {
	st := newStack(t, server.Config{DrainDelay: time.Hour})
	const hello, never = "GET /v1/hello", "GET /v1/never"
	for _, p := range []string{hello, never} {
		if err := st.srv.DeclareHTTP(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.srv.Handle("GET /debug/ping", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "pong")
	})); err != nil {
		t.Fatal(err)
	}
	st.start(t)
	client := httpClient(t)
	base := "http://" + st.addr()
	want := func(when, path string, code int, body string) answer {
		t.Helper()
		a := getAnswer(t, client, base+path)
		if a.code != code || !strings.Contains(a.body, body) {
			t.Errorf("%s: GET %s = %d %q, want %d with %q", when, path, a.code, a.body, code, body)
		}
		if code == http.StatusServiceUnavailable && a.retry != "1" {
			t.Errorf("%s: GET %s: Retry-After %q, want 1", when, path, a.retry)
		}
		return a
	}

	starting := "GET /v1/hello unavailable: starting: phase reclaim 1200/5000 namespaces\n"
	want("before bind", "/v1/hello", 503, starting)
	if err := st.srv.BindHTTP(hello, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "hello")
	})); err != nil {
		t.Fatal(err)
	}
	// Bound, but the gate is closed until the lifecycle serves.
	want("bound while starting", "/v1/hello", 503, starting)
	want("starting", "/debug/ping", 200, "pong") // ungated

	st.serve(t)
	want("serving", "/v1/hello", 200, "hello")
	want("serving, never bound", "/v1/never", 503, "GET /v1/never unavailable: handler not bound yet")

	drainCtx, cutShort := context.WithCancel(context.Background())
	drained := make(chan error, 1)
	go func() { drained <- st.srv.Drain(drainCtx) }()
	waitUntil(t, "the server to drain", func() bool {
		return getAnswer(t, client, base+"/readyz").code == http.StatusServiceUnavailable
	})
	if a := want("draining", "/v1/hello", 503, "GET /v1/hello unavailable: draining"); !a.close {
		t.Error("draining: the 503 does not close the connection")
	}
	want("draining", "/livez", 200, "ok")
	want("draining", "/debug/ping", 200, "pong")
	cutShort()
	recv(t, drained, "the drain")
}

// A drain that arrives during the start: the port answers through the
// drain delay, gated routes say draining, /startupz stays 503 (the start
// never completed) and /livez 200.
func TestGatedHTTPRouteDrainDuringStart(t *testing.T) {
	st := newStack(t, server.Config{DrainDelay: time.Hour})
	if err := st.srv.DeclareHTTP("GET /v1/hello"); err != nil {
		t.Fatal(err)
	}
	st.start(t)
	client := httpClient(t)
	base := "http://" + st.addr()

	drainCtx, cutShort := context.WithCancel(context.Background())
	drained := make(chan error, 1)
	go func() { drained <- st.lc.Drain(drainCtx) }() // listen's Stop drains the server
	waitUntil(t, "the gated route to say draining", func() bool {
		return strings.Contains(getAnswer(t, client, base+"/v1/hello").body, "unavailable: draining")
	})
	for _, tt := range []struct {
		path string
		code int
		body string
	}{
		{"/livez", 200, "ok"},
		{"/readyz", 503, "[-]lifecycle draining"},
		{"/startupz", 503, "[-]lifecycle draining"},
		{"/v1/hello", 503, "GET /v1/hello unavailable: draining"},
	} {
		if a := getAnswer(t, client, base+tt.path); a.code != tt.code || !strings.Contains(a.body, tt.body) {
			t.Errorf("GET %s = %d %q, want %d with %q", tt.path, a.code, a.body, tt.code, tt.body)
		}
	}
	cutShort()
	recv(t, drained, "the drain")
}

func TestDeclareHTTPErrors(t *testing.T) {
	st := newStack(t, server.Config{})
	if err := st.srv.DeclareHTTP("GET /v1/x"); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"twice", st.srv.DeclareHTTP("GET /v1/x")},
		{"conflicting with /health", st.srv.DeclareHTTP("/health")},
		{"invalid pattern", st.srv.DeclareHTTP("GET")},
		{"bind undeclared", st.srv.BindHTTP("GET /v1/y", http.NotFoundHandler())},
		{"bind nil", st.srv.BindHTTP("GET /v1/x", nil)},
	} {
		if tt.err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
}
