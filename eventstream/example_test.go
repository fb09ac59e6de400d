package eventstream_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/phasegate/phasegate/eventstream"
	"github.com/phasegate/phasegate/lifecycle"
)

// A daemon serves its lifecycle's events next to its other debug
// endpoints; an operator, a test or another program follows them from the
// port, from the first event to the last.
func Example() {
	noop := func(context.Context, *lifecycle.Progress) error { return nil }
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: noop},
		{Name: "listen", DependsOn: []string{"lock"}, Run: noop},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("GET /debug/events", eventstream.NewHandler(lc))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	ran := make(chan error, 1)
	go func() {
		if err := lc.Start(context.Background()); err != nil {
			ran <- err
			return
		}
		ran <- lc.Drain(context.Background())
	}()

	// Follow reconnects and resumes by sequence number if the connection
	// drops, and fails on a gap: nil means every event, once, in order.
	err = eventstream.Follow(context.Background(), srv.URL+"/debug/events", 0, func(e lifecycle.Event) error {
		fmt.Printf("%d %-9s %-6s %s → %s\n", e.Seq, e.Kind, e.Name, e.From, e.To)
		return nil
	})
	fmt.Println(err, <-ran)
	// Output:
	// 1 lifecycle        created → starting
	// 2 phase     lock   pending → running
	// 3 phase     lock   running → succeeded
	// 4 phase     listen pending → running
	// 5 phase     listen running → succeeded
	// 6 lifecycle        starting → serving
	// 7 lifecycle        serving → draining
	// 8 lifecycle        draining → stopped
	// <nil> <nil>
}
