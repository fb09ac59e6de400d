package phasetest_test

import (
	"context"
	"fmt"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/phasetest"
)

// A Recorder is a hook: it keeps every event the lifecycle hands it, and
// replays them, then the new ones, to whoever watches it. A test passes it
// to WaitState, WaitPhase and the assertions; here it is printed.
func ExampleRecorder() {
	var rec phasetest.Recorder
	noop := func(context.Context, *lifecycle.Progress) error { return nil }
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: noop},
		{Name: "serve", DependsOn: []string{"lock"}, Run: noop},
	}, lifecycle.WithEventHook(rec.Record))
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = lc.Start(context.Background())
	_ = lc.Drain(context.Background())

	// The hook may still be catching up: watching the recorder waits for
	// it, and ends after the final event.
	for e := range rec.WatchEvents(context.Background(), 0) {
		fmt.Println(e)
	}
	fmt.Println(rec.Err())
	// Output:
	// #1 lifecycle created→starting
	// #2 phase lock pending→running (attempt 1)
	// #3 phase lock running→succeeded (attempt 1)
	// #4 phase serve pending→running (attempt 1)
	// #5 phase serve running→succeeded (attempt 1)
	// #6 lifecycle starting→serving
	// #7 lifecycle serving→draining
	// #8 lifecycle draining→stopped
	// <nil>
}
