package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/server"
)

// A daemon wires the server into its own phase graph: listen serves the
// port right after the lock, register binds the implementations, and the
// gate opens when the lifecycle serves. Draining the lifecycle drains the
// server first (serve's Stop runs first), and listen's Stop covers a
// start that fails half-way.
func Example() {
	var srv *server.Server // the phases below run after it is made
	noop := func(context.Context, *lifecycle.Progress) error { return nil }
	drain := func(ctx context.Context) error { return srv.Drain(ctx) }
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: noop},
		{Name: "listen", DependsOn: []string{"lock"}, Stop: drain, Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			return srv.Serve(ctx) // binds and serves at once; health says NOT_SERVING
		}},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: noop},
		{Name: "register", DependsOn: []string{"listen", "reclaim"}, Run: func(context.Context, *lifecycle.Progress) error {
			// The generated Register function binds the declared service:
			// its name and its interface are checked by the compiler.
			b := srv.Binder()
			testpb.RegisterTestServiceServer(b, testpb.UnimplementedTestServiceServer{})
			return b.Err()
		}},
		// Stop must outlast DrainDelay + StopTimeout.
		{Name: "serve", DependsOn: []string{"register"}, Run: noop, Stop: drain, StopTimeout: time.Minute},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	hc := health.New(lc, health.Options{Version: "1.0.0"})
	defer hc.Close()
	srv, err = server.New(server.Config{
		Addr:        "127.0.0.1:0",
		Health:      hc,
		Gate:        server.LifecycleGate(lc),
		DrainDelay:  10 * time.Millisecond,
		StopTimeout: time.Second,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Every service is declared before Serve.
	if err := srv.Declare(&testpb.TestService_ServiceDesc); err != nil {
		fmt.Println(err)
		return
	}

	if err := lc.Start(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	resp, err := http.Get("http://" + srv.Addr().String() + "/readyz")
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(lc.State(), resp.StatusCode)

	// On SIGTERM: drain with a ctx that a second signal cancels.
	fmt.Println(lc.Drain(context.Background()), lc.State())
	http.DefaultClient.CloseIdleConnections()
	// Output:
	// serving 200
	// <nil> stopped
}

// An HTTP route of the application waits for the daemon the way a gRPC
// service does: declared early, bound by the phase that makes it ready,
// 503 with the reason until the lifecycle serves.
func ExampleServer_DeclareHTTP() {
	reported, release := make(chan struct{}), make(chan struct{})
	var srv *server.Server
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "listen", Run: func(ctx context.Context, _ *lifecycle.Progress) error { return srv.Serve(ctx) }},
		{Name: "populate", DependsOn: []string{"listen"}, Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(16, "slots")
			p.SetDone(3)
			close(reported)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
			p.SetDone(16)
			return srv.BindHTTP("GET /v1/slots", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprintln(w, "16 slots")
			}))
		}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv, err = server.New(server.Config{Addr: "127.0.0.1:0", Gate: server.LifecycleGate(lc)})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := srv.DeclareHTTP("GET /v1/slots"); err != nil {
		fmt.Println(err)
		return
	}
	started := make(chan error, 1)
	go func() { started <- lc.Start(context.Background()) }()
	get := func() {
		resp, err := http.Get("http://" + srv.Addr().String() + "/v1/slots")
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d Retry-After=%q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	<-reported
	get()
	close(release)
	<-started
	get()
	_ = lc.Drain(context.Background())
	_ = srv.Drain(context.Background())
	http.DefaultClient.CloseIdleConnections()
	// Output:
	// 503 Retry-After="1" GET /v1/slots unavailable: starting: phase populate 3/16 slots
	// 200 Retry-After="" 16 slots
}
