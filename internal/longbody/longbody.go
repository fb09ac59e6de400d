// Package longbody makes, for tests, a lifecycle whose /health body is well
// past the 4 KiB a checker such as Consul keeps.
//
// It has sixty phases with long names (all succeeded but one, held running
// until the test ends) and eight long warnings. The health package's tests
// cut the body themselves; the end-to-end tests read it through a real
// Consul agent.
package longbody

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/lifecycle"
)

// Phases is how many quick phases the lifecycle has besides the held one.
const Phases = 60

// Start starts the lifecycle and returns it; its "slow" phase runs until
// the test ends, when the lifecycle is drained.
func Start(t testing.TB) *lifecycle.Lifecycle {
	t.Helper()
	release := make(chan struct{})
	phases := []lifecycle.Phase{{
		Name: "slow",
		Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		},
	}}
	for i := range Phases {
		phases = append(phases, lifecycle.Phase{
			Name: fmt.Sprintf("quick-phase-with-a-long-name-%02d", i),
			Run:  func(context.Context, *lifecycle.Progress) error { return nil },
		})
	}
	lc, err := lifecycle.New(phases)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- lc.Start(context.Background()) }()
	t.Cleanup(func() {
		close(release)
		<-started
		_ = lc.Drain(context.Background())
	})
	for i := range 8 {
		lc.Warn(fmt.Sprintf("warning-%d", i), strings.Repeat("a long warning that says a lot; ", 10))
	}
	return lc
}
