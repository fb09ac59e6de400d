package server_test

import (
	"context"
	"crypto/tls"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/internal/testcerts"
	"github.com/phasegate/phasegate/server"
)

// A gRPC message over MaxRecvMsgSize is refused with ResourceExhausted,
// and a connection with no call in flight for IdleTimeout is closed by the
// server (the client reconnects for its next call).
func TestGRPCMessageAndIdleBounds(t *testing.T) {
	cfg := server.Config{IdleTimeout: 300 * time.Millisecond}
	cfg.MaxRecvMsgSize = 1 << 10
	st := newStack(t, cfg)
	st.start(t)
	conn := st.grpcConn(t)
	if got := checkHealth(t, conn, ""); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("a small Check: %v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: strings.Repeat("x", 2<<10)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 2 KiB Check with MaxRecvMsgSize 1 KiB: %v, want ResourceExhausted", err)
	}
	if st.srv.ConnStats().Open != 1 {
		t.Fatalf("open connections: %+v, want the client's one", st.srv.ConnStats())
	}
	waitUntil(t, "the idle connection to be closed by the server", func() bool { return st.srv.ConnStats().Open == 0 })
	if got := checkHealth(t, conn, ""); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("a Check after the idle close: %v", got)
	}
}

// payloads counts the messages the server read.
type payloads struct{ n atomic.Int64 }

func (p *payloads) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (p *payloads) HandleRPC(_ context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.InPayload); ok {
		p.n.Add(1)
	}
}
func (p *payloads) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (p *payloads) HandleConn(context.Context, stats.ConnStats)                       {}

// With RequireClientCert, a declared service's call without a client
// certificate is refused before its message is read: an unauthenticated
// peer cannot make the server hold a message of MaxRecvMsgSize, however
// large the bound its authenticated clients need.
func TestUnauthenticatedCallIsNotRead(t *testing.T) {
	certs, err := testcerts.New()
	if err != nil {
		t.Fatal(err)
	}
	read := &payloads{}
	cfg := server.Config{
		TLS:               &tls.Config{Certificates: []tls.Certificate{certs.Server}, ClientCAs: certs.CAPool},
		RequireClientCert: true,
		GRPCOptions:       []grpc.ServerOption{grpc.StatsHandler(read)},
	}
	cfg.MaxRecvMsgSize = 8 << 20
	st := newStack(t, cfg)
	st.start(t)
	st.serve(t)
	dial := func(cert bool) testpb.TestServiceClient {
		tc := &tls.Config{RootCAs: certs.CAPool, ServerName: "127.0.0.1"}
		if cert {
			tc.Certificates = []tls.Certificate{certs.Client}
		}
		conn, err := grpc.NewClient(st.addr(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return testpb.NewTestServiceClient(conn)
	}
	big := &testpb.SimpleRequest{Payload: &testpb.Payload{Body: make([]byte, 4<<20)}}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err = dial(false).UnaryCall(ctx, big)
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a 4 MiB call without a client certificate: %v, want Unauthenticated", err)
	}
	if n := read.n.Load(); n != 0 {
		t.Fatalf("the server read %d messages of the refused call", n)
	}
	// The mutation check: with a certificate the same message is read.
	close(st.impl.unblock)
	if _, err := dial(true).UnaryCall(ctx, big); err != nil {
		t.Fatalf("the call with a client certificate: %v", err)
	}
	if n := read.n.Load(); n != 1 {
		t.Fatalf("the server read %d messages of the admitted call, want 1", n)
	}
}
