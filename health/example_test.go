package health_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"google.golang.org/grpc"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/health/sdnotify"
	"github.com/phasegate/phasegate/lifecycle"
)

// A checker follows a lifecycle; its gRPC service, HTTP endpoints and
// sd_notify lines all read the same state.
func Example() {
	reported, release := make(chan struct{}), make(chan struct{})
	lc, _ := lifecycle.New([]lifecycle.Phase{{
		Name: "reclaim",
		Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(5000, "namespaces")
			p.SetDone(1200)
			close(reported)
			<-release
			return nil
		},
	}})
	c := health.New(lc, health.Options{Version: "1.0.0"})
	defer c.Close()
	gs := grpc.NewServer()
	c.Register(gs)                               // before gs.Serve
	n, _ := sdnotify.New(lc, sdnotify.Options{}) // inert without NOTIFY_SOCKET
	defer n.Close()

	started := make(chan error)
	go func() { started <- lc.Start(context.Background()) }()
	<-reported
	h := health.NewHandler(c)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz?verbose", nil))
	fmt.Print(w.Code, "\n", w.Body)

	close(release)
	<-started
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	fmt.Println(w.Code, w.Body)
	_ = lc.Drain(context.Background())
	// Output:
	// 503
	// [-]lifecycle starting: phase reclaim 1200/5000 namespaces
	// [-]phase/reclaim running: 1200/5000 namespaces
	// readyz check failed
	// 200 ok
}

// Describe is the one-line reason every dialect gives.
func ExampleDescribe() {
	fmt.Println(health.Describe(lifecycle.Snapshot{
		State: lifecycle.StateStarting,
		Phases: []lifecycle.PhaseSnapshot{{
			Name:     "reclaim",
			State:    lifecycle.PhaseRunning,
			Progress: lifecycle.ProgressSnapshot{Done: 1200, Total: 5000, Unit: "namespaces"},
		}},
	}))
	// Output: starting: phase reclaim 1200/5000 namespaces
}
