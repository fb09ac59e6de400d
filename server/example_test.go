package server_test

import (
	"context"
	"fmt"
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
			return srv.Bind("grpc.testing.TestService", testpb.UnimplementedTestServiceServer{})
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
