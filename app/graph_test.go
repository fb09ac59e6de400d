package app

import (
	"context"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// The start budget follows the slowest chain, counts the App's own phases
// as nothing, is capped by StartTimeout, and falls back to it when a phase
// has no timeout.
func TestStartBudget(t *testing.T) {
	nop := func(context.Context, *lifecycle.Progress) error { return nil }
	chain := []lifecycle.Phase{
		{Name: "a", Run: nop, Timeout: time.Second},
		{Name: "b", DependsOn: []string{"a"}, Run: nop, Timeout: 3 * time.Second},
		{Name: "c", DependsOn: []string{"a"}, Run: nop, Timeout: 2 * time.Second},
		{Name: "d", DependsOn: []string{"b", "c"}, Run: nop, Timeout: time.Second},
	}
	untimed := append(append([]lifecycle.Phase{}, chain...), lifecycle.Phase{Name: "e", Run: nop})
	for _, tc := range []struct {
		name         string
		phases       []lifecycle.Phase
		startTimeout time.Duration
		want         time.Duration
	}{
		{"slowest chain a, b, d", chain, 0, 5 * time.Second},
		{"capped by StartTimeout", chain, 4 * time.Second, 4 * time.Second},
		{"a phase without timeout: StartTimeout", untimed, time.Minute, time.Minute},
		{"a phase without timeout, no StartTimeout: unbounded", untimed, 0, 0},
	} {
		cfg := DefaultConfig("budget", "127.0.0.1:0")
		cfg.StartTimeout = tc.startTimeout
		a, err := New(cfg, tc.phases...)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.StartBudget(); got != tc.want {
			t.Errorf("%s: StartBudget %v, want %v", tc.name, got, tc.want)
		}
		_ = a.Stop(context.Background())
	}
}
