package control_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/peer"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/testcerts"
	"github.com/phasegate/phasegate/server"
)

// serveRateLimited serves the test service over mutual TLS behind a
// guard on every route, whose policy grants the client certificate of
// certs (x509:cn:sandbox-scheduler) a burst of one call and then one every
// 10 s, so that nothing in a test is given back its call by the clock; it
// returns the guard, a client with that certificate and the audit log.
func serveRateLimited(t *testing.T, certs *testcerts.Set) (*control.Guard, *grpc.ClientConn, *lockedBuffer) {
	t.Helper()
	rule, err := control.ParseRule("id:cn:sandbox-scheduler=*", false)
	if err != nil {
		t.Fatal(err)
	}
	p := &control.AccessPolicy{Rate: 0.1, Rules: []control.Rule{rule}}
	logs := &lockedBuffer{}
	g, err := control.NewGuard(p, control.GuardOptions{Service: "grpc.testing.TestService", Surface: "test", Reads: []string{"UnaryCall"},
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveTest(t, server.Config{Listener: lis, StopTimeout: time.Second, RequireClientCert: true,
		TLS: &tls.Config{Certificates: []tls.Certificate{certs.Server}, ClientCAs: certs.CAPool},
		GRPCOptions: []grpc.ServerOption{grpc.InTapHandle(g.Tap),
			grpc.ChainUnaryInterceptor(g.Intercept), grpc.ChainStreamInterceptor(g.InterceptStream)}})
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{RootCAs: certs.CAPool, Certificates: []tls.Certificate{certs.Client}})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return g, cc, logs
}

// Every route of a surface guarded with the tap, the stream interceptor
// and the HTTP wrapper spends from one bucket per principal: a principal
// that spent its burst on reflection messages is refused the guarded
// service's calls, an unknown method and the HTTP route, while root is
// served. The principal here is a certificate's (root is exempt, and the
// test runs as root on the socket).
func TestGuardRateCoversEveryRoute(t *testing.T) {
	certs, err := testcerts.New()
	if err != nil {
		t.Fatal(err)
	}
	g, cc, logs := serveRateLimited(t, certs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	exhausted := func(what string, err error) {
		t.Helper()
		if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "x509:cn:sandbox-scheduler: rate limit") {
			t.Errorf("%s past the burst: %v, want ResourceExhausted naming the principal's rate", what, err)
		}
	}

	// The stream's opening and first message are the burst; the second
	// message is a call past it.
	stream, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	list := &reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}
	if err := stream.Send(list); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("the first reflection request: %v", err)
	}
	if err := stream.Send(list); err != nil && !errors.Is(err, io.EOF) { // io.EOF: Recv has the status
		t.Fatal(err)
	}
	_, err = stream.Recv()
	exhausted("a second reflection request on the stream", err)

	_, err = testpb.NewTestServiceClient(cc).UnaryCall(ctx, &testpb.SimpleRequest{})
	exhausted("a call of the guarded service", err)
	err = cc.Invoke(ctx, "/grpc.testing.TestService/NoSuchMethod", &testpb.Empty{}, &testpb.Empty{})
	exhausted("a call of a method nobody serves", err)
	if lines := logs.lines(t); len(lines) != 1 || lines[0]["method"] != "UnaryCall" || lines[0]["outcome"] != "ResourceExhausted" ||
		lines[0]["principal"] != "x509:cn:sandbox-scheduler" {
		t.Errorf("audit lines %v: want the guarded call's refusal, once", lines)
	}

	// The HTTP route spends from the same bucket.
	leaf, err := x509.ParseCertificate(certs.Client.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /debug/x", g.HTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := control.CallerFrom(r.Context())
		_ = json.NewEncoder(w).Encode(c.Principal.String())
	})))
	get := func(r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}
	req := httptest.NewRequest(http.MethodGet, "/debug/x", nil)
	req.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf}}}
	if w := get(req); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "rate limit") {
		t.Errorf("HTTP past the burst: %d %q Retry-After %q, want 429 with Retry-After", w.Code, w.Body, w.Header().Get("Retry-After"))
	}
	rootCtx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: server.PeerCred{}})
	for range 5 {
		if w := get(req.Clone(rootCtx)); w.Code != http.StatusOK || strings.TrimSpace(w.Body.String()) != `"uid:0"` {
			t.Fatalf("root over HTTP: %d %q, want 200 with its principal", w.Code, w.Body)
		}
	}
	stranger := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: server.PeerCred{UID: 65534, GID: 65534}})
	if w := get(req.Clone(stranger)); w.Code != http.StatusForbidden {
		t.Errorf("a principal granted nothing over HTTP: %d %q, want 403", w.Code, w.Body)
	}
	anonymous := httptest.NewRequest(http.MethodGet, "/debug/x", nil)
	if w := get(anonymous); w.Code != http.StatusUnauthorized {
		t.Errorf("no credentials over HTTP: %d %q, want 401", w.Code, w.Body)
	}
}

// A fresh principal's first HTTP request is served, and Retry-After says
// how long until the next: the rate's interval, in whole seconds.
func TestGuardHTTPRetryAfter(t *testing.T) {
	rule, err := control.ParseRule("uid:1000=*", false)
	if err != nil {
		t.Fatal(err)
	}
	g, err := control.NewGuard(&control.AccessPolicy{Rate: 0.25, Rules: []control.Rule{rule}}, control.GuardOptions{Service: "x"})
	if err != nil {
		t.Fatal(err)
	}
	h := g.HTTP(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: server.PeerCred{UID: 1000, GID: 1000}})
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("first request: %d %q", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "4" {
		t.Fatalf("second request: %d Retry-After %q, want 429 and 4", w.Code, w.Header().Get("Retry-After"))
	}
}
