package health_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/lifecycle"
)

// /health tells, for each phase not yet over, the longest it can run
// before it fails for good: the adopter's registry, 5 attempts of 300ms
// 50ms apart doubling with 10% jitter, at most 2.325s; a phase that
// succeeded, or one nothing bounds, says nothing of it.
func TestHealthJSONShowsTheWorstCase(t *testing.T) {
	release, running := make(chan struct{}), make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "config", Run: func(context.Context, *lifecycle.Progress) error { return nil }},
		{Name: "registry", DependsOn: []string{"config"}, Timeout: 300 * time.Millisecond,
			Retry: lifecycle.RetryPolicy{Attempts: 5, Backoff: 50 * time.Millisecond, Jitter: 0.1},
			Run: func(ctx context.Context, _ *lifecycle.Progress) error {
				close(running)
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}},
		{Name: "serve", DependsOn: []string{"registry"}, Timeout: time.Second,
			Run: func(context.Context, *lifecycle.Progress) error { return nil }},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := health.New(lc, health.Options{})
	defer c.Close()
	h := health.NewHandler(c)
	started := make(chan error, 1)
	go func() { started <- lc.Start(context.Background()) }()
	<-running
	worstCases := func() map[string]string {
		got := map[string]string{}
		for name, cs := range decodeHealth(t, get(h, http.MethodGet, "/health")).Checks {
			got[name] = cs[0].WorstCase
		}
		return got
	}
	for name, want := range map[string]string{"phase:config": "", "phase:registry": "2.325s", "phase:serve": "1s"} {
		if got := worstCases()[name]; got != want {
			t.Errorf("while registry runs, %s's worst case %q, want %q", name, got, want)
		}
	}
	close(release)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	defer lc.Drain(context.Background())
	for name, got := range worstCases() {
		if got != "" {
			t.Errorf("serving, %s's worst case %q, want none once over", name, got)
		}
	}
}
