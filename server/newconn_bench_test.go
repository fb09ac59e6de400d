package server_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The checks below are made as checkers make them: a new TCP connection
// each, the path on which the port decides a connection's protocol and
// bounds it before it knows it. Run them with few calls: each leaves a
// socket in TIME_WAIT, and loopback has some 28,000 ports to give.
//
//	go test -run '^$' -bench NewConn -benchtime 4000x -count 5 ./server/

// BenchmarkNewConnCheck compares a grpc.health.v1 Check on a new
// connection each (dial, Check, close) through phasegate's port with the
// same through grpc-go's stock health server on a plain listener.
func BenchmarkNewConnCheck(b *testing.B) {
	check := func(addr string) func(context.Context) error {
		return func(ctx context.Context) error {
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			defer conn.Close()
			resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			if err == nil && resp.Status != healthpb.HealthCheckResponse_SERVING {
				b.Fatalf("status %v", resp.Status)
			}
			return err
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, grpchealth.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(l) }()
	b.Cleanup(func() { gs.Stop(); <-done })

	srv, lc := servingStack(b, false)
	if err := lc.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	sideBySide(b,
		&variant{name: "stock", op: check(l.Addr().String())},
		&variant{name: "phasegate", op: check(srv.Addr().String())},
	)
}

// BenchmarkNewConnHTTPHealth compares GET /health on a new connection each
// through phasegate's port with the same handler on a plain net/http
// server.
func BenchmarkNewConnHTTPHealth(b *testing.B) {
	get := func(url string) func(context.Context) error {
		return func(ctx context.Context) error {
			tr := &http.Transport{DisableKeepAlives: true}
			defer tr.CloseIdleConnections()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return err
			}
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("GET /health = %d", resp.StatusCode)
			}
			return nil
		}
	}
	plain, phasegate := healthServers(b)
	sideBySide(b,
		&variant{name: "plain", op: get("http://" + plain + "/health")},
		&variant{name: "phasegate", op: get("http://" + phasegate + "/health")},
	)
}
