package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/phasegate/phasegate/server"
)

// HTTP/1 and gRPC share the port concurrently.
func TestHTTPAndGRPCConcurrently(t *testing.T) {
	st := newStack(t, server.Config{})
	st.start(t)
	st.serve(t)
	conn := st.grpcConn(t)
	client := httpClient(t)
	tc := testpb.NewTestServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	const workers, calls = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for range workers {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range calls {
				resp, err := client.Get("http://" + st.addr() + "/readyz")
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("GET /readyz = %d", resp.StatusCode)
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range calls {
				if _, err := tc.EmptyCall(ctx, &testpb.Empty{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// The HTTP endpoints on the real port: kube-style checks, HEAD, 405, 404,
// the health+json shape, and handlers added late.
func TestHTTPEndpoints(t *testing.T) {
	st := newStack(t, server.Config{})
	st.start(t)
	if err := st.srv.Handle("/debug/hello", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "hello")
	})); err != nil {
		t.Fatal(err)
	}
	if err := st.srv.Handle("/health", http.NotFoundHandler()); err == nil {
		t.Error("Handle accepted a pattern that conflicts with /health")
	}
	client := httpClient(t)
	base := "http://" + st.addr()
	tests := []struct {
		method, path string
		code         int
		ctype        string
		body         []string
	}{
		{"GET", "/health", 503, "application/health+json", []string{`{"status":"fail",`, `"output":"starting: phase reclaim 1200/5000 namespaces"`, `"observedValue":1200`}},
		{"GET", "/health?pretty", 503, "application/health+json", []string{`"status": "fail"`, `"output": "starting: phase reclaim 1200/5000 namespaces"`, `"phase:reclaim"`, `"observedValue": 1200`, `"observedUnit": "namespaces"`, `"state": "starting"`, `"since"`}},
		{"HEAD", "/health", 503, "application/health+json", nil},
		{"GET", "/livez", 200, "text/plain; charset=utf-8", []string{"ok"}},
		{"GET", "/readyz?verbose", 503, "text/plain; charset=utf-8", []string{"[+]phase/lock ok", "[-]phase/reclaim running: 1200/5000 namespaces", "readyz check failed"}},
		{"GET", "/startupz?exclude=lifecycle&exclude=phase/reclaim&exclude=phase/register&exclude=phase/serve", 200, "text/plain; charset=utf-8", []string{"ok"}},
		{"GET", "/startupz?verbose&exclude=phase/reclaim", 503, "text/plain; charset=utf-8", []string{"[+]phase/reclaim excluded: ok", "[-]phase/register pending"}},
		{"POST", "/readyz", 405, "", nil},
		{"GET", "/nope", 404, "", nil},
		{"GET", "/debug/hello", 200, "", []string{"hello"}},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, base+tt.path, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.code {
			t.Errorf("%s %s = %d, want %d\n%s", tt.method, tt.path, resp.StatusCode, tt.code, body)
		}
		if tt.ctype != "" && resp.Header.Get("Content-Type") != tt.ctype {
			t.Errorf("%s %s: Content-Type %q", tt.method, tt.path, resp.Header.Get("Content-Type"))
		}
		if tt.ctype != "" && resp.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("%s %s: Cache-Control %q", tt.method, tt.path, resp.Header.Get("Cache-Control"))
		}
		for _, want := range tt.body {
			if !strings.Contains(string(body), want) {
				t.Errorf("%s %s: body lacks %q\n%s", tt.method, tt.path, want, body)
			}
		}
	}
}

// HTTP/1.0 without keep-alive and a raw HTTP/1.1 request on a raw socket
// are routed to HTTP, not left to the sniff timeout.
func TestRawHTTP1(t *testing.T) {
	st := newStack(t, server.Config{SniffTimeout: time.Hour})
	st.start(t)
	c := dialRaw(t, st.addr())
	if _, err := io.WriteString(c, "GET /livez HTTP/1.0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.0 200") {
		t.Errorf("status line %q, %v", line, err)
	}
}

// Without a drain, a connection that sends nothing is dropped once the
// sniff timeout and the HTTP header timeout passed.
func TestSilentConnectionIsDropped(t *testing.T) {
	st := newStack(t, server.Config{SniffTimeout: 20 * time.Millisecond, ReadHeaderTimeout: 20 * time.Millisecond})
	st.start(t)
	c := dialRaw(t, st.addr())
	_ = c.SetReadDeadline(time.Now().Add(wait))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("silent connection: read %v, want it closed by the server", err)
	}
}
