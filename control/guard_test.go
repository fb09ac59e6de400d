package control_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/server"
)

// guarded is a service that answers with what the guard told it.
type guarded struct {
	testpb.UnimplementedTestServiceServer
}

// EmptyCall stands for a mutating call: it notes an owner for the audit.
func (guarded) EmptyCall(ctx context.Context, _ *testpb.Empty) (*testpb.Empty, error) {
	c, ok := control.CallerFrom(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no caller")
	}
	control.Note(ctx, "owner", "sandbox-1")
	if !c.Grant.MayLease("sandbox-1") {
		return nil, status.Errorf(codes.PermissionDenied, "%s may not", c.Principal)
	}
	return &testpb.Empty{}, nil
}

// UnaryCall stands for a read: it returns the principal.
func (guarded) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	c, _ := control.CallerFrom(ctx)
	return &testpb.SimpleResponse{Username: c.Principal.String()}, nil
}

// lockedBuffer is a log sink the server's goroutines write to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the JSON log lines so far.
func (l *lockedBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, ln := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if ln == "" {
			continue
		}
		m := map[string]any{}
		if err := json.Unmarshal([]byte(ln), &m); err != nil {
			t.Fatalf("log line %q: %v", ln, err)
		}
		out = append(out, m)
	}
	return out
}

// serveGuarded serves the test service behind a guard of p on lis and
// returns a client and the audit log.
func serveGuarded(t *testing.T, lis net.Listener, p *control.AccessPolicy, target string) (testpb.TestServiceClient, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	g, err := control.NewGuard(p, control.GuardOptions{
		Service: "grpc.testing.TestService", Mutating: []string{"EmptyCall"}, Surface: "test",
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	serveTest(t, server.Config{Listener: lis, DisableReflection: true, StopTimeout: time.Second,
		GRPCOptions: []grpc.ServerOption{grpc.ChainUnaryInterceptor(g.Intercept)}})
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return testpb.NewTestServiceClient(cc), logs
}

// serveTest serves the guarded test service as cfg says until the test
// ends.
func serveTest(t *testing.T, cfg server.Config) {
	t.Helper()
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Declare(&testpb.TestService_ServiceDesc); err != nil {
		t.Fatal(err)
	}
	if err := srv.Bind("grpc.testing.TestService", guarded{}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Drain(context.Background()) })
}

// On the Unix socket the kernel names the caller; the guard hands the
// service its grant and audits the mutating call with the owner noted.
func TestGuardOnTheSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "control.sock")
	lis, _, err := control.Listen(context.Background(), path, control.SocketOptions{GID: -1})
	if err != nil {
		t.Fatal(err)
	}
	self := fmt.Sprintf("uid:%d", os.Getuid())
	rule, err := control.ParseRule(self+"=sandbox-*", false)
	if err != nil {
		t.Fatal(err)
	}
	c, logs := serveGuarded(t, lis, &control.AccessPolicy{Rules: []control.Rule{rule}}, "unix://"+path)
	ctx := context.Background()
	if _, err := c.EmptyCall(ctx, &testpb.Empty{}); err != nil {
		t.Fatalf("EmptyCall as %s: %v", self, err)
	}
	resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
	if err != nil || resp.GetUsername() != self {
		t.Fatalf("UnaryCall: %v %v, want principal %s", resp, err, self)
	}
	lines := logs.lines(t)
	if len(lines) != 1 {
		t.Fatalf("audit lines %v: want one, for the mutating call only", lines)
	}
	l := lines[0]
	if l["method"] != "EmptyCall" || l["principal"] != self || l["owner"] != "sandbox-1" || l["outcome"] != "OK" ||
		l["pid"] != float64(os.Getpid()) || l["surface"] != "test" {
		t.Fatalf("audit line %v", l)
	}
}

// Over TCP without a client certificate nobody is anybody: Unauthenticated,
// audited as refused.
func TestGuardRefusesTCPWithoutCertificate(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, logs := serveGuarded(t, lis, &control.AccessPolicy{}, lis.Addr().String())
	_, err = c.UnaryCall(context.Background(), &testpb.SimpleRequest{})
	if st := status.Convert(err); st.Code() != codes.Unauthenticated || !strings.Contains(st.Message(), "client certificate") {
		t.Fatalf("UnaryCall over TCP: %v, want Unauthenticated naming the client certificate", err)
	}
	lines := logs.lines(t)
	if len(lines) != 1 || lines[0]["outcome"] != "Unauthenticated" || lines[0]["principal"] != "anonymous" {
		t.Fatalf("audit lines %v: want one refusal of anonymous", lines)
	}
}

// A principal past its rate gets ResourceExhausted naming the limit; root,
// which may do everything, has no rate.
func TestGuardRateLimit(t *testing.T) {
	p := &control.AccessPolicy{Rate: 0.5, Rules: []control.Rule{}} // a burst of one, then one call every 2 s
	for _, r := range []string{"uid:1000=*"} {
		rule, err := control.ParseRule(r, false)
		if err != nil {
			t.Fatal(err)
		}
		p.Rules = append(p.Rules, rule)
	}
	g, err := control.NewGuard(p, control.GuardOptions{Service: "grpc.testing.TestService", Surface: "test"})
	if err != nil {
		t.Fatal(err)
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/grpc.testing.TestService/UnaryCall"}
	call := func(uid uint32) error {
		ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: server.PeerCred{UID: uid, GID: uid}})
		_, err := g.Intercept(ctx, &testpb.SimpleRequest{}, info, func(ctx context.Context, req any) (any, error) {
			return guarded{}.UnaryCall(ctx, req.(*testpb.SimpleRequest))
		})
		return err
	}
	if err := call(1000); err != nil {
		t.Fatal(err)
	}
	err = call(1000)
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "rate limit") {
		t.Fatalf("second call within the burst's refill: %v, want ResourceExhausted naming the rate limit", err)
	}
	for range 5 {
		if err := call(0); err != nil {
			t.Fatalf("root past the rate: %v", err)
		}
	}
}
