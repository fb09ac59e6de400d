package server_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/stats"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/server"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// wait bounds every wait on a condition; conditions are met in
// milliseconds, the bound only keeps a broken test from hanging.
const wait = 10 * time.Second

const testService = "grpc.testing.TestService"

// testImpl is the application service of the tests. UnaryCall blocks until
// unblock is closed, so a test can hold a call in flight.
type testImpl struct {
	testpb.UnimplementedTestServiceServer
	entered chan struct{} // receives when UnaryCall started
	unblock chan struct{}
}

func newTestImpl() *testImpl {
	return &testImpl{entered: make(chan struct{}, 16), unblock: make(chan struct{})}
}

func (*testImpl) EmptyCall(context.Context, *testpb.Empty) (*testpb.Empty, error) {
	return &testpb.Empty{}, nil
}

func (i *testImpl) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	i.entered <- struct{}{}
	select {
	case <-i.unblock:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &testpb.SimpleResponse{Username: "done"}, nil
}

func (*testImpl) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testpb.StreamingOutputCallResponse]) error {
	for range 3 {
		if err := s.Send(&testpb.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
	return nil
}

// observed counts what interceptors and stats handlers saw.
type observed struct {
	mu       sync.Mutex
	methods  []string
	servers  []any
	rpcBegun atomic.Int64
}

func (o *observed) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if strings.HasPrefix(info.FullMethod, "/"+testService+"/") {
		o.mu.Lock()
		o.methods = append(o.methods, info.FullMethod)
		o.servers = append(o.servers, info.Server)
		o.mu.Unlock()
	}
	return h(ctx, req)
}

func (o *observed) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (o *observed) HandleRPC(_ context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.Begin); ok {
		o.rpcBegun.Add(1)
	}
}
func (o *observed) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (o *observed) HandleConn(context.Context, stats.ConnStats)                       {}

// stack is a daemon in miniature: a lifecycle whose phases drive a
// server the way a real daemon does.
//
//	lock ──► listen ───────────────► register ──► serve
//	   └───► reclaim (held open) ──┘
type stack struct {
	lc       *lifecycle.Lifecycle
	srv      *server.Server
	hc       *health.Checker
	impl     *testImpl
	obs      *observed
	startAt  time.Time
	listenAt time.Time // when listen's Run returned

	listening  chan struct{}
	reclaiming chan struct{}
	release    chan struct{}
	releaseMu  sync.Once
	startErr   chan error
}

func newStack(t *testing.T, cfg server.Config) *stack {
	t.Helper()
	st := &stack{
		impl:       newTestImpl(),
		obs:        &observed{},
		listening:  make(chan struct{}),
		reclaiming: make(chan struct{}),
		release:    make(chan struct{}),
		startErr:   make(chan error, 1),
	}
	noop := func(context.Context, *lifecycle.Progress) error { return nil }
	drain := func(ctx context.Context) error { return st.srv.Drain(ctx) }
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: noop},
		{Name: "listen", DependsOn: []string{"lock"}, Stop: drain, Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			if err := st.srv.Serve(ctx); err != nil {
				return err
			}
			st.listenAt = time.Now()
			close(st.listening)
			return nil
		}},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(5000, "namespaces")
			p.SetDone(1200)
			close(st.reclaiming)
			select {
			case <-st.release:
			case <-ctx.Done():
				return ctx.Err()
			}
			p.SetDone(5000)
			return nil
		}},
		{Name: "register", DependsOn: []string{"listen", "reclaim"}, Run: func(context.Context, *lifecycle.Progress) error {
			return st.srv.Bind(testService, st.impl)
		}},
		{Name: "serve", DependsOn: []string{"register"}, Run: noop, Stop: drain},
	}, lifecycle.WithProgressInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	st.lc = lc
	st.hc = health.New(lc, health.Options{Version: "test"})
	if cfg.Addr == "" && cfg.Listener == nil {
		cfg.Addr = "127.0.0.1:0"
	}
	cfg.Health = st.hc
	cfg.Gate = server.LifecycleGate(lc)
	cfg.GRPCOptions = append(cfg.GRPCOptions, grpc.UnaryInterceptor(st.obs.unary), grpc.StatsHandler(st.obs))
	st.srv, err = server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.srv.Declare(&testpb.TestService_ServiceDesc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.releaseStart()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		_ = lc.Drain(ctx)
		_ = st.srv.Drain(ctx) // in case the lifecycle never started
		st.hc.Close()
	})
	return st
}

// start starts the lifecycle and returns once the port serves and reclaim
// holds startup open at 1200/5000 namespaces.
func (st *stack) start(t *testing.T) {
	t.Helper()
	st.startAt = time.Now()
	go func() { st.startErr <- st.lc.Start(context.Background()) }()
	recv(t, st.listening, "the port to be served")
	recv(t, st.reclaiming, "reclaim to report progress")
	waitUntil(t, "phase listen to succeed", func() bool {
		p, _ := st.lc.Snapshot().Phase("listen")
		return p.State == lifecycle.PhaseSucceeded
	})
}

func (st *stack) releaseStart() { st.releaseMu.Do(func() { close(st.release) }) }

// serve lets startup finish.
func (st *stack) serve(t *testing.T) {
	t.Helper()
	st.releaseStart()
	if err := recv(t, st.startErr, "startup to finish"); err != nil {
		t.Fatal(err)
	}
}

func (st *stack) addr() string { return st.srv.Addr().String() }

// grpcConn dials the port with a grpc-go client.
func (st *stack) grpcConn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(st.addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// httpClient returns a client whose idle connections go with the test.
func httpClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: wait}
}

func checkHealth(t *testing.T, conn *grpc.ClientConn, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("Check(%q): %v", service, err)
	}
	return resp.Status
}

func recv[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(wait):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

// dialRaw opens a TCP connection that the test controls byte by byte.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, wait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
