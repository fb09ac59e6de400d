package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/server"
)

const (
	serving    = healthpb.HealthCheckResponse_SERVING
	notServing = healthpb.HealthCheckResponse_NOT_SERVING
)

// The port answers while a phase still holds startup open: HTTP 503 naming
// the phase and its progress, gRPC NOT_SERVING to grpc-go and to
// grpc-health-probe; and SERVING once startup finished.
func TestPortAnswersDuringStartup(t *testing.T) {
	bin := healthProbe(t)
	st := newStack(t, server.Config{})
	st.start(t)
	client := httpClient(t)

	resp, err := client.Get("http://" + st.addr() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	answered := time.Since(st.startAt)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("Start → port bound %v, → first HTTP answer %v", st.listenAt.Sub(st.startAt), answered)
	if answered > 5*time.Second { // sanity only; the benchmark measures it
		t.Errorf("first answer %v after Start", answered)
	}
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("GET /health = %d, want 503", resp.StatusCode)
	}
	var doc struct {
		Status, Output string
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("body: %v\n%s", err, body)
	}
	if doc.Status != "fail" || doc.Output != "starting: phase reclaim 1200/5000 namespaces" {
		t.Errorf("body status %q output %q", doc.Status, doc.Output)
	}

	conn := st.grpcConn(t)
	if got := checkHealth(t, conn, ""); got != notServing {
		t.Errorf(`Check("") = %v while starting`, got)
	}
	if code, out := probe(t, bin, st.addr()); code != 4 {
		t.Errorf("grpc-health-probe while starting: exit %d, want 4\n%s", code, out)
	}

	st.serve(t)
	// The checker applies the change on its own goroutine, a moment later.
	waitUntil(t, `Check("") to be SERVING`, func() bool { return checkHealth(t, conn, "") == serving })
	if code, out := probe(t, bin, st.addr()); code != 0 {
		t.Errorf("grpc-health-probe once serving: exit %d, want 0\n%s", code, out)
	}
	if code, out := probe(t, bin, st.addr(), "-service="+health.PhaseServicePrefix+"reclaim"); code != 0 {
		t.Errorf("grpc-health-probe -service=phasegate.phase.reclaim: exit %d\n%s", code, out)
	}
	resp, err = client.Get("http://" + st.addr() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /health once serving = %d", resp.StatusCode)
	}
}

// Watch sees NOT_SERVING → SERVING → NOT_SERVING (drain) in order, and the
// phase entries flip as their phases succeed.
func TestWatchThroughLifecycle(t *testing.T) {
	st := newStack(t, server.Config{DrainDelay: 50 * time.Millisecond})
	st.start(t)
	conn := st.grpcConn(t)
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	type update struct {
		status healthpb.HealthCheckResponse_ServingStatus
		err    error
	}
	watch := func(service string) <-chan update {
		stream, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatal(err)
		}
		c := make(chan update, 16)
		go func() {
			defer close(c)
			for {
				resp, err := stream.Recv()
				if err != nil {
					c <- update{err: err}
					return
				}
				c <- update{status: resp.Status}
			}
		}()
		return c
	}
	next := func(c <-chan update, service string) update {
		t.Helper()
		return recv(t, c, "a Watch update of "+service)
	}
	overall := watch("")
	reclaim := watch(health.PhaseServicePrefix + "reclaim")
	app := watch(testService)
	for _, w := range []struct {
		c       <-chan update
		service string
	}{{overall, `""`}, {reclaim, "reclaim"}, {app, testService}} {
		if u := next(w.c, w.service); u.status != notServing {
			t.Fatalf("%s: first Watch update %v %v, want NOT_SERVING", w.service, u.status, u.err)
		}
	}
	waitUntil(t, "phase listen to be reported SERVING", func() bool {
		return checkHealth(t, conn, health.PhaseServicePrefix+"listen") == serving
	})
	list, err := hc.List(ctx, &healthpb.HealthListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for name := range list.Statuses {
		names = append(names, name)
	}
	for _, want := range []string{"", testService, "phasegate.phase.lock", "phasegate.phase.listen", "phasegate.phase.reclaim", "phasegate.phase.register", "phasegate.phase.serve"} {
		if _, ok := list.Statuses[want]; !ok {
			t.Errorf("List lacks %q: %q", want, names)
		}
	}

	st.serve(t)
	if u := next(reclaim, "reclaim"); u.status != serving {
		t.Errorf("reclaim: %v %v, want SERVING", u.status, u.err)
	}
	if u := next(overall, `""`); u.status != serving {
		t.Errorf(`"": %v %v, want SERVING`, u.status, u.err)
	}
	if u := next(app, testService); u.status != serving {
		t.Errorf("%s: %v %v, want SERVING", testService, u.status, u.err)
	}

	drained := make(chan error, 1)
	go func() { drained <- st.lc.Drain(context.Background()) }()
	if u := next(overall, `""`); u.status != notServing {
		t.Errorf(`"" at drain: %v %v, want NOT_SERVING`, u.status, u.err)
	}
	if u := next(app, testService); u.status != notServing {
		t.Errorf("%s at drain: %v %v, want NOT_SERVING", testService, u.status, u.err)
	}
	// The stream then ends so that the graceful stop need not wait for it.
	if u := next(overall, `""`); status.Code(u.err) != codes.Unavailable {
		t.Errorf(`"" after drain: %v %v, want the stream to end with Unavailable`, u.status, u.err)
	}
	if err := recv(t, drained, "the drain"); err != nil {
		t.Errorf("Drain: %v", err)
	}
}

// Before its implementation is bound, an application call fails at once
// with Unavailable naming the phase; the same connection then works once
// the daemon serves, natively dispatched.
func TestLateBoundService(t *testing.T) {
	st := newStack(t, server.Config{})
	st.start(t)
	conn := st.grpcConn(t)
	tc := testpb.NewTestServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	// Warm the connection up so the figure below is the call, not the dial.
	_ = checkHealth(t, conn, "")
	begin := time.Now()
	_, err := tc.EmptyCall(ctx, &testpb.Empty{})
	took := time.Since(begin)
	t.Logf("Unavailable after %v", took)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("EmptyCall before bind: %v, want Unavailable", err)
	}
	msg := status.Convert(err).Message()
	if !strings.Contains(msg, "phase reclaim 1200/5000 namespaces") || !strings.Contains(msg, testService) {
		t.Errorf("Unavailable message %q does not name the service, the phase and its progress", msg)
	}
	if took > time.Second { // not a hang; the benchmark has the real figure
		t.Errorf("Unavailable took %v", took)
	}
	stream, err := tc.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("streaming call before bind: %v, want Unavailable", err)
	}
	st.obs.mu.Lock()
	refused := len(st.obs.methods)
	st.obs.mu.Unlock()
	if n := refused; n != 0 {
		t.Errorf("the unary interceptor saw %d refused calls; refused calls end before it", n)
	}

	st.serve(t)
	if _, err := tc.EmptyCall(ctx, &testpb.Empty{}); err != nil {
		t.Fatalf("EmptyCall on the same connection once serving: %v", err)
	}
	stream, err = tc.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for ; ; n++ {
		if _, err := stream.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("stream: %v", err)
		}
	}
	if n != 3 {
		t.Errorf("stream sent %d messages, want 3", n)
	}
	// Unimplemented methods of a bound service stay Unimplemented.
	if _, err := tc.UnimplementedCall(ctx, &testpb.Empty{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("UnimplementedCall: %v", err)
	}

	st.obs.mu.Lock()
	methods, servers := st.obs.methods, st.obs.servers
	st.obs.mu.Unlock()
	if len(methods) == 0 || methods[0] != "/grpc.testing.TestService/EmptyCall" || servers[0] != st.impl {
		t.Errorf("interceptor saw %q with servers %v; want EmptyCall with the bound implementation", methods, servers)
	}
	if st.obs.rpcBegun.Load() < 4 {
		t.Errorf("stats handler saw %d RPCs", st.obs.rpcBegun.Load())
	}
	info := st.srv.GetServiceInfo()
	if si, ok := info[testService]; !ok || len(si.Methods) != 8 || si.Metadata != testpb.TestService_ServiceDesc.Metadata {
		t.Errorf("GetServiceInfo()[%s] = %+v", testService, si)
	}
}

// Server reflection lists the declared services, so grpcurl works.
func TestReflection(t *testing.T) {
	st := newStack(t, server.Config{})
	st.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(st.grpcConn(t)).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{testService, "grpc.health.v1.Health"} {
		if !containsString(names, want) {
			t.Errorf("reflection lists %q, missing %s", names, want)
		}
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: testService},
	}); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Errorf("no file descriptor for %s: %v %v", testService, err, resp.GetErrorResponse())
	}
	_ = stream.CloseSend()
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// During the drain delay, an in-flight call finishes and a new one is
// refused with Unavailable; health is already NOT_SERVING.
func TestDrainLetsInFlightCallsFinish(t *testing.T) {
	st := newStack(t, server.Config{DrainDelay: time.Hour})
	st.start(t)
	st.serve(t)
	conn := st.grpcConn(t)
	tc := testpb.NewTestServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	inflight := make(chan error, 1)
	go func() {
		resp, err := tc.UnaryCall(ctx, &testpb.SimpleRequest{})
		if err == nil && resp.Username != "done" {
			err = fmt.Errorf("response %v", resp)
		}
		inflight <- err
	}()
	recv(t, st.impl.entered, "the call to be in flight")

	drainCtx, cutShort := context.WithCancel(context.Background())
	defer cutShort()
	drained := make(chan error, 1)
	go func() { drained <- st.srv.Drain(drainCtx) }()

	waitUntil(t, "health to go NOT_SERVING", func() bool { return checkHealth(t, conn, "") == notServing })
	_, err := tc.EmptyCall(ctx, &testpb.Empty{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "draining") {
		t.Errorf("new call while draining: %v, want Unavailable naming the drain", err)
	}
	close(st.impl.unblock)
	if err := recv(t, inflight, "the in-flight call"); err != nil {
		t.Errorf("in-flight call: %v", err)
	}

	// The delay is an hour: a second Drain with an ended ctx (a second
	// signal) cuts it short.
	second := make(chan error, 1)
	ended, end := context.WithCancel(context.Background())
	end()
	go func() { second <- st.srv.Drain(ended) }()
	err1, err2 := recv(t, drained, "the first Drain"), recv(t, second, "the second Drain")
	if err1 == nil || !strings.Contains(err1.Error(), "cut short") || err1.Error() != err2.Error() {
		t.Errorf("Drain results %v / %v; want the same cut-short error", err1, err2)
	}
	if err := st.srv.Drain(context.Background()); err == nil || err.Error() != err1.Error() {
		t.Errorf("third Drain: %v", err)
	}
	select {
	case <-st.srv.Done():
	default:
		t.Error("Done not closed after Drain")
	}
	if err := st.srv.Err(); err != nil {
		t.Errorf("Err() = %v after a clean drain", err)
	}
	if err := st.srv.Serve(context.Background()); !errors.Is(err, server.ErrClosed) {
		t.Errorf("Serve after Drain: %v", err)
	}
}

// A connection that sends nothing, or half a preface, does not hold up the
// drain, however long the sniff timeout, and also without one. With a short
// one the silent connection's sniff is over before the drain: it used to be
// handed to the HTTP server, whose Shutdown waited for it to the end of the
// stop timeout (it takes a connection that never sent a byte for an active
// one during its first 5 s), and the half preface, a request begun and never
// finished, was waited for the same way.
func TestSilentConnectionsDoNotDelayDrain(t *testing.T) {
	for _, sniff := range []time.Duration{time.Hour, 0, 50 * time.Millisecond} {
		t.Run(fmt.Sprintf("SniffTimeout=%v", sniff), func(t *testing.T) {
			testSilentConnectionsDoNotDelayDrain(t, sniff)
		})
	}
}

func testSilentConnectionsDoNotDelayDrain(t *testing.T, sniff time.Duration) {
	st := newStack(t, server.Config{SniffTimeout: sniff, StopTimeout: 500 * time.Millisecond})
	st.start(t)
	st.serve(t)
	silent := dialRaw(t, st.addr())
	half := dialRaw(t, st.addr())
	if _, err := half.Write([]byte("PRI * HTTP/2.0\r\n")); err != nil {
		t.Fatal(err)
	}
	// An HTTP/1 keep-alive connection and a gRPC one, both idle.
	client := httpClient(t)
	if resp, err := client.Get("http://" + st.addr() + "/livez"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	_ = checkHealth(t, st.grpcConn(t), "")
	if sniff > 0 && sniff < time.Second {
		// The silent connection's sniff times out before the drain: the
		// multiplexer closes it (net/http never sees it).
		_ = silent.SetReadDeadline(time.Now().Add(wait))
		if n, err := silent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("a silent connection past its sniff timeout: read %d, %v; want it closed by the server", n, err)
		}
	}

	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := st.lc.Drain(ctx); err != nil {
		t.Errorf("Drain: %v", err)
	}
	took := time.Since(begin)
	t.Logf("drain with silent connections took %v", took)
	if took > wait/2 {
		t.Errorf("drain took %v", took)
	}
	for _, c := range []net.Conn{silent, half} {
		_ = c.SetReadDeadline(time.Now().Add(wait))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Error("a silent connection is still open after the drain")
		}
	}
	if _, err := net.DialTimeout("tcp", st.addr(), time.Second); err == nil {
		t.Error("the port still accepts after the drain")
	}
}

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

func TestDeclareAndBindErrors(t *testing.T) {
	st := newStack(t, server.Config{})
	if err := st.srv.Declare(&testpb.TestService_ServiceDesc); err == nil {
		t.Error("declaring a service twice succeeded")
	}
	if err := st.srv.Declare(&grpc.ServiceDesc{ServiceName: "x.Y", HandlerType: 3}); err == nil {
		t.Error("a HandlerType that is not an interface pointer was accepted")
	}
	if err := st.srv.Bind("no.such.Service", st.impl); err == nil {
		t.Error("binding an undeclared service succeeded")
	}
	if err := st.srv.Bind(testService, struct{}{}); err == nil {
		t.Error("binding a value that does not implement the service succeeded")
	}
	if err := st.srv.Bind(testService, nil); err == nil {
		t.Error("binding nil succeeded")
	}
	st.start(t)
	err := st.srv.Declare(&reflectionpb.ServerReflection_ServiceDesc)
	if !errors.Is(err, server.ErrServing) {
		t.Errorf("Declare after Serve: %v, want ErrServing", err)
	}
	bare, err := server.New(server.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.Listen(context.Background()); !errors.Is(err, server.ErrNoAddr) {
		t.Errorf("Listen without Addr, Listener or SetPort: %v, want ErrNoAddr", err)
	}
	_ = bare.Drain(context.Background())
}

// A listener that fails while serving closes Done and reports why.
func TestServeFailureIsReported(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Listener: l})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = l.Close() // from under the server
	recv(t, srv.Done(), "Done after the listener failed")
	if err := srv.Err(); err == nil || !strings.Contains(err.Error(), "stopped serving") {
		t.Errorf("Err() = %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_ = srv.Drain(ctx)
}

// Drain before Serve releases the port and makes Serve refuse.
func TestDrainBeforeServe(t *testing.T) {
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "x", Run: func(context.Context, *lifecycle.Progress) error { return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	hc := health.New(lc, health.Options{})
	defer hc.Close()
	srv, err := server.New(server.Config{Addr: "127.0.0.1:0", Health: hc})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := srv.Listen(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background()); !errors.Is(err, server.ErrClosed) {
		t.Errorf("Serve after Drain: %v", err)
	}
	if _, err := net.DialTimeout("tcp", addr.String(), time.Second); err == nil {
		t.Error("port still open")
	}
}

// waitUntil polls cond until it holds, failing after wait. It stands for
// conditions another goroutine makes true shortly after the test acted.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
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

// An explicit zero drain delay is no delay: the drain of an idle server does
// not wait the 5 s that a zero once stood for. The ctx bound is a generous
// sanity bound below those 5 s; a delay still waited for would be cut short
// by it and reported.
func TestZeroDrainDelayMeansNone(t *testing.T) {
	srv, err := server.New(server.Config{Addr: "127.0.0.1:0", DrainDelay: 0, StopTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	if err := srv.Drain(ctx); err != nil {
		t.Errorf("Drain with DrainDelay 0: %v", err)
	}
}

// A negative duration means nothing: New says which field, instead of
// reading it as "no delay" or "the default".
func TestConfigRejectsNegativeDurations(t *testing.T) {
	for _, tt := range []struct {
		field string
		set   func(*server.Config)
	}{
		{"SniffTimeout", func(c *server.Config) { c.SniffTimeout = -time.Second }},
		{"ReadHeaderTimeout", func(c *server.Config) { c.ReadHeaderTimeout = -time.Second }},
		{"ReadTimeout", func(c *server.Config) { c.ReadTimeout = -time.Second }},
		{"WriteTimeout", func(c *server.Config) { c.WriteTimeout = -time.Second }},
		{"IdleTimeout", func(c *server.Config) { c.IdleTimeout = -time.Second }},
		{"DrainDelay", func(c *server.Config) { c.DrainDelay = -1 }},
		{"StopTimeout", func(c *server.Config) { c.StopTimeout = -time.Second }},
	} {
		t.Run(tt.field, func(t *testing.T) {
			cfg := server.DefaultConfig()
			cfg.Addr = "127.0.0.1:0"
			tt.set(&cfg)
			_, err := server.New(cfg)
			if err == nil || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("New with a negative %s: %v, want an error naming the field", tt.field, err)
			}
		})
	}
}

// DefaultConfig carries the recommended bounds that a zero once stood for;
// a zero in a field now means no bound.
func TestDefaultConfig(t *testing.T) {
	got := server.DefaultConfig()
	want := server.Config{
		SniffTimeout:      5 * time.Second,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		DrainDelay:        5 * time.Second,
		StopTimeout:       10 * time.Second,
	}
	if got.SniffTimeout != want.SniffTimeout || got.ReadHeaderTimeout != want.ReadHeaderTimeout ||
		got.ReadTimeout != want.ReadTimeout || got.WriteTimeout != want.WriteTimeout ||
		got.IdleTimeout != want.IdleTimeout || got.DrainDelay != want.DrainDelay || got.StopTimeout != want.StopTimeout {
		t.Errorf("DefaultConfig() = %+v", got)
	}
}

// Alive probes the port itself: nil before Serve, nil while the port
// answers /livez, an error naming the answer once /livez fails (a failed
// lifecycle) or the port is gone from under the server, nil again once the
// server drains.
func TestAlive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st := newStack(t, server.Config{})
	if err := st.srv.Alive(ctx); err != nil {
		t.Errorf("Alive before Serve: %v", err)
	}
	st.start(t)
	if err := st.srv.Alive(ctx); err != nil {
		t.Errorf("Alive while starting: %v", err)
	}
	st.serve(t)
	if err := st.lc.Fail(errors.New("reconciler died")); err != nil {
		t.Fatal(err)
	}
	if err := st.srv.Alive(ctx); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("Alive with a failed lifecycle: %v, want the 503 of /livez", err)
	}
	if err := st.srv.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.srv.Alive(ctx); err != nil {
		t.Errorf("Alive once drained: %v", err)
	}

	// A listener that dies under a serving server.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "x", Run: func(context.Context, *lifecycle.Progress) error { return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	hc := health.New(lc, health.Options{})
	defer hc.Close()
	srv, err := server.New(server.Config{Listener: l, Health: hc})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Drain(ctx) }()
	if err := srv.Serve(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Alive(ctx); err != nil {
		t.Errorf("Alive on a fresh port: %v", err)
	}
	_ = l.Close()
	recv(t, srv.Done(), "Done after the listener failed")
	if err := srv.Alive(ctx); err == nil {
		t.Error("Alive with the listener gone: nil")
	}
}

// A drain hurried from its start (a second signal) with nothing in flight
// has nothing to cut short, and says so: it used to report "gRPC graceful
// stop" or "gRPC handlers" not finished when a select picked the hurry over
// a graceful stop that was ending at the same moment.
func TestHurriedDrainWithNothingInFlightReportsNothing(t *testing.T) {
	for i := range 50 {
		srv, err := server.New(server.Config{Addr: "127.0.0.1:0", StopTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Serve(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := srv.Drain(ctx); err != nil {
			t.Fatalf("drain %d, hurried, nothing in flight: %v", i, err)
		}
	}
}
