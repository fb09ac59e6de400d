package health_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/lifecycle"
)

// BenchmarkHandler is the cost of one answer of each HTTP endpoint for a
// serving daemon with the seven phases of phasegate and a background task,
// without the network: what every check costs the daemon on top of
// net/http.
func BenchmarkHandler(b *testing.B) {
	noop := func(context.Context, *lifecycle.Progress) error { return nil }
	task := make(chan struct{})
	b.Cleanup(func() { close(task) })
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: noop},
		{Name: "listen", DependsOn: []string{"lock"}, Run: noop},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(_ context.Context, p *lifecycle.Progress) error {
			p.SetTotal(5000, "namespaces")
			p.SetDone(5000)
			return nil
		}},
		{Name: "storage", DependsOn: []string{"reclaim"}, Run: func(_ context.Context, p *lifecycle.Progress) error {
			p.Defer("reconcile", func(ctx context.Context, _ *lifecycle.Progress) error {
				select {
				case <-ctx.Done():
				case <-task:
				}
				return nil
			})
			return nil
		}},
		{Name: "populate", DependsOn: []string{"storage"}, Run: noop},
		{Name: "register", DependsOn: []string{"populate", "listen"}, Run: noop},
		{Name: "serve", DependsOn: []string{"register"}, Run: noop},
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := lc.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = lc.Drain(context.Background()) })
	c := health.New(lc, health.Options{Version: "1.2.3"})
	b.Cleanup(c.Close)
	h := health.NewHandler(c)
	for _, path := range []string{health.PathHealth, health.PathHealth + "?pretty", health.PathReadyz, health.PathReadyz + "?verbose"} {
		b.Run(path, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, path, nil)
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("GET %s = %d", path, w.Code)
				}
			}
		})
	}
}
