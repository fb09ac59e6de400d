package sdnotify_test

import (
	"context"
	"log"
	"sync/atomic"
	"time"

	"github.com/phasegate/phasegate/health/sdnotify"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/server"
)

// A daemon under systemd (Type=notify, WatchdogSec=, TimeoutStartSec=)
// starts from the recommended options, gives its start budget, and proves
// itself alive through its own port once it serves.
func ExampleNew() {
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
	opts := sdnotify.DefaultOptions()
	opts.StartBudget = startTimeout + rollback
	opts.Alive = func(ctx context.Context) error {
		if s := srv.Load(); s != nil {
			return s.Alive(ctx) // GET /livez on its own port while it serves
		}
		return nil // the lifecycle answering is all there is to prove yet
	}
	opts.OnAliveError = func(err error) { log.Print(err) }
	n, err := sdnotify.New(lc, opts) // inert without NOTIFY_SOCKET
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
