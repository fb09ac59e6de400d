package phasetest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/phasetest"
)

// printT stands in for a test's *testing.T in an example: it prints
// failures instead of failing.
type printT struct{ testing.TB }

func (printT) Helper()                           {}
func (printT) Errorf(format string, args ...any) { fmt.Printf(format+"\n", args...) }

// A test shows that upstream ran beside db, not after it, and that
// neither waited out a timeout, from the event log alone. In a real test
// t is the test's *testing.T.
func ExampleAssertOverlap() {
	var t testing.TB = printT{}
	var rec phasetest.Recorder
	// Each waits until the other runs: they can only end once both began.
	meet := func(mine, other chan struct{}) func(context.Context, *lifecycle.Progress) error {
		return func(ctx context.Context, _ *lifecycle.Progress) error {
			close(mine)
			select {
			case <-other:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	db, upstream := make(chan struct{}), make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "config", Run: func(context.Context, *lifecycle.Progress) error { return nil }},
		{Name: "db", DependsOn: []string{"config"}, Run: meet(db, upstream)},
		{Name: "upstream", DependsOn: []string{"config"}, Run: meet(upstream, db)},
	}, lifecycle.WithEventHook(rec.Record))
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = lc.Start(context.Background())
	_ = lc.Drain(context.Background())
	var events []lifecycle.Event
	for e := range rec.WatchEvents(context.Background(), 0) {
		events = append(events, e)
	}

	fmt.Println("db and upstream overlapped:", phasetest.AssertOverlap(t, events, "db", "upstream"))
	fmt.Println("db took at most a minute:", phasetest.AssertTookAtMost(t, events, "db", time.Minute))
	// Output:
	// db and upstream overlapped: true
	// db took at most a minute: true
}
