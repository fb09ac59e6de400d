package health_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/server"
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
	c.Register(gs)                                           // before gs.Serve
	n, _ := health.NewNotifier(lc, health.NotifierOptions{}) // inert without NOTIFY_SOCKET
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

// A daemon under systemd (Type=notify, WatchdogSec=, TimeoutStartSec=)
// starts from the recommended options, gives its start budget, and proves
// itself alive through its own port once it serves.
func ExampleNewNotifier() {
	var srv atomic.Pointer[server.Server] // set by the listen phase
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name: "listen",
		Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			s, err := server.New(server.Config{Addr: "127.0.0.1:0"})
			if err != nil {
				return err
			}
			srv.Store(s)
			return s.Serve(ctx)
		},
		Stop: func(ctx context.Context) error { return srv.Load().Drain(ctx) },
	}})
	if err != nil {
		log.Fatal(err)
	}
	const startTimeout, rollback = 10 * time.Minute, 30 * time.Second // --start-timeout, the stops' bound
	opts := health.DefaultNotifierOptions()
	opts.StartBudget = startTimeout + rollback
	opts.Alive = func(ctx context.Context) error {
		if s := srv.Load(); s != nil {
			return s.Alive(ctx) // GET /livez on its own port while it serves
		}
		return nil // the lifecycle answering is all there is to prove yet
	}
	opts.OnAliveError = func(err error) { log.Print(err) }
	n, err := health.NewNotifier(lc, opts) // inert without NOTIFY_SOCKET
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := lc.Start(ctx); err != nil {
		log.Print(err)
	}
	_ = lc.Drain(context.Background())
}
