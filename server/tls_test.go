package server_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/internal/testcerts"
	"github.com/phasegate/phasegate/server"
)

func TestTLSOnOnePortWithClientCertificatesForAppServices(t *testing.T) {
	certs, err := testcerts.New()
	if err != nil {
		t.Fatal(err)
	}
	st := newStack(t, server.Config{
		TLS:               &tls.Config{Certificates: []tls.Certificate{certs.Server}, ClientCAs: certs.CAPool},
		RequireClientCert: true,
	})
	if err := st.srv.DeclareHTTP("GET /v1/hello"); err != nil {
		t.Fatal(err)
	}
	if err := st.srv.BindHTTP("GET /v1/hello", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello")
	})); err != nil {
		t.Fatal(err)
	}
	st.start(t)
	st.serve(t)

	dialTLS := func(withClientCert bool) *grpc.ClientConn {
		cfg := &tls.Config{RootCAs: certs.CAPool, ServerName: "127.0.0.1"}
		if withClientCert {
			cfg.Certificates = []tls.Certificate{certs.Client}
		}
		conn, err := grpc.NewClient(st.addr(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	// Checkers have no client certificate: health answers them.
	anon := dialTLS(false)
	if got := checkHealth(t, anon, ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health over TLS: %v", got)
	}
	// The application service demands one...
	_, err = testpb.NewTestServiceClient(anon).EmptyCall(ctx, &testpb.Empty{})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("app call without a client certificate: %v, want Unauthenticated", err)
	}
	// ...and takes the call with it, through the interceptors as usual.
	if _, err := testpb.NewTestServiceClient(dialTLS(true)).EmptyCall(ctx, &testpb.Empty{}); err != nil {
		t.Fatalf("app call with a client certificate: %v", err)
	}

	checkHTTPSWithClientCertificates(t, st, certs)
	// The self-probe speaks TLS to its own port, without a client
	// certificate: /livez is open to checkers.
	if err := st.srv.Alive(ctx); err != nil {
		t.Errorf("Alive over TLS: %v", err)
	}

	checkPlainTextGetsNowhere(t, st.addr())
}

// checkHTTPSWithClientCertificates checks the port's HTTP side over TLS:
// h2 offered, http/1.1 served; a gated route refused without a client
// certificate and served with one.
func checkHTTPSWithClientCertificates(t *testing.T, st *stack, certs *testcerts.Set) {
	t.Helper()
	// HTTP clients that offer h2 get http/1.1, which the port serves.
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: certs.CAPool}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: wait}).Get("https://" + st.addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 1 {
		t.Fatalf("HTTPS /readyz: %s over %s", resp.Status, resp.Proto)
	}
	// A gated HTTP route is application API: no client certificate, 403;
	// with one, its handler.
	for _, withCert := range []bool{false, true} {
		cfg := &tls.Config{RootCAs: certs.CAPool}
		want := http.StatusForbidden
		if withCert {
			cfg.Certificates, want = []tls.Certificate{certs.Client}, http.StatusOK
		}
		tr := &http.Transport{TLSClientConfig: cfg}
		resp, err := (&http.Client{Transport: tr, Timeout: wait}).Get("https://" + st.addr() + "/v1/hello")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		tr.CloseIdleConnections()
		if resp.StatusCode != want {
			t.Errorf("HTTPS /v1/hello with a client certificate %v: %s %q, want %d", withCert, resp.Status, body, want)
		}
	}
}

// checkPlainTextGetsNowhere checks that plain HTTP on the TLS port at addr
// is not served and does not hang.
func checkPlainTextGetsNowhere(t *testing.T, addr string) {
	t.Helper()
	// Plain text on the TLS port gets nowhere and does not hang.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	_, _ = c.Write([]byte("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
	buf := make([]byte, 64)
	n, _ := c.Read(buf)
	if n > 0 && string(buf[:4]) == "HTTP" && string(buf[9:12]) == "200" {
		t.Fatalf("plain HTTP was served on the TLS port: %q", buf[:n])
	}
}

func TestTLSConfigErrors(t *testing.T) {
	if _, err := server.New(server.Config{Addr: "127.0.0.1:0", RequireClientCert: true}); err == nil {
		t.Error("RequireClientCert without TLS accepted")
	}
	if _, err := server.New(server.Config{Addr: "127.0.0.1:0", TLS: &tls.Config{}, RequireClientCert: true}); err == nil {
		t.Error("RequireClientCert without ClientCAs accepted")
	}
}
