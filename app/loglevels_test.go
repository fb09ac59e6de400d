package app

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// The App's log says what happened at the level it deserves and in the
// order it happened: a phase cut short by an orderly drain is INFO with
// the drain as its reason, and the App's own lines ("serving", "stopped")
// come after the lifecycle lines that led to them.
func TestLogLevelsAndOrder(t *testing.T) {
	tests := []struct {
		name string
		// cache is the slow phase; serve says whether the App is let serve
		// before the SIGTERM.
		serve   bool
		inOrder [][]string // chains of fragments, each in this order
		absent  []string
	}{
		{
			name: "a drain during the start",
			inOrder: [][]string{{
				`msg="phase started" phase=cache`,
				`level=INFO msg="draining during startup" signal=terminated`,
				"msg=lifecycle state=draining from=starting",
				`level=INFO msg="phase ended" phase=cache state=cancelled`,
				`reason="lifecycle: drained during the start`,
				"msg=lifecycle state=stopped from=draining",
				"level=INFO msg=stopped",
			}},
			absent: []string{"level=ERROR"},
		},
		{
			name:  "serving, then a SIGTERM",
			serve: true,
			inOrder: [][]string{
				{`msg="phase started" phase=listen`, "msg=listening"},
				{
					`msg="phase ended" phase=upstream state=succeeded`,
					"msg=lifecycle state=serving from=starting",
					"level=INFO msg=serving",
					"msg=lifecycle state=stopped from=draining",
					"level=INFO msg=stopped",
				},
			},
			absent: []string{"level=ERROR"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := logOfARunStoppedBySIGTERM(t, tt.serve)
			checkLogFragments(t, out, tt.inOrder, tt.absent)
		})
	}
}

// blocking is a phase's Run that closes started and returns when cancelled.
func blocking(started chan<- struct{}) func(context.Context, *lifecycle.Progress) error {
	return func(ctx context.Context, _ *lifecycle.Progress) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	}
}

// logOfARunStoppedBySIGTERM runs an App with a phase cache (slow unless
// serve) beside a quick one, sends SIGTERM once cache started (and, with
// serve, once the App serves), and returns its text log.
func logOfARunStoppedBySIGTERM(t *testing.T, serve bool) string {
	t.Helper()
	var buf lockedBuffer
	cfg := testConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	started := make(chan struct{})
	cache := lifecycle.Phase{Name: "cache", Run: blocking(started)}
	if serve {
		cache.Run = func(context.Context, *lifecycle.Progress) error { close(started); return nil }
	}
	a, err := New(cfg, cache,
		// Parallel with cache, and slower than serving's own line
		// would be if it did not wait for the log to catch up.
		lifecycle.Phase{Name: "upstream", Run: nop},
	)
	if err != nil {
		t.Fatal(err)
	}
	sigs := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() { done <- a.run(context.Background(), sigs) }()
	<-started
	if serve {
		if err := waitState(a, lifecycle.StateServing); err != nil {
			t.Fatal(err)
		}
	}
	sigs <- syscall.SIGTERM
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run = %v, want an orderly stop", err)
		}
	case <-time.After(wait):
		t.Fatal("run did not return")
	}
	return buf.String()
}

// checkLogFragments checks that out holds each chain of inOrder's fragments
// in its order, and none of absent.
func checkLogFragments(t *testing.T, out string, inOrder [][]string, absent []string) {
	t.Helper()
	for _, chain := range inOrder {
		rest := out
		for _, want := range chain {
			i := strings.Index(rest, want)
			if i < 0 {
				t.Fatalf("the log lacks %q after the fragments before it, %q:\n%s", want, chain, out)
			}
			rest = rest[i+len(want):]
		}
	}
	for _, bad := range absent {
		if strings.Contains(out, bad) {
			t.Errorf("the log has %q:\n%s", bad, out)
		}
	}
}

// A failing start logs its failure once: the failed phase's end carries
// the error, and every later line names the phase instead (the lifecycle
// failed, a phase it cut short, "startup failed", Main's exit). On 65cb2fe
// the error was logged four times, and the phase cut short said it again
// at ERROR.
func TestAFailingStartLogsItsFailureOnce(t *testing.T) {
	const why = "the store is unreachable: 9f3c"
	var buf lockedBuffer
	cfg := testConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	started := make(chan struct{})
	a, err := New(cfg,
		lifecycle.Phase{Name: "cache", Run: blocking(started)},
		lifecycle.Phase{Name: "store", Run: func(context.Context, *lifecycle.Progress) error {
			<-started
			return lifecycle.Permanent(errors.New(why))
		}},
	)
	if err != nil {
		t.Fatal(err)
	}
	if code := a.Main(); code != ExitFailure {
		t.Fatalf("Main = %d, want %d", code, ExitFailure)
	}
	out := buf.String()
	if n := strings.Count(out, why); n != 1 {
		t.Errorf("the failure is logged %d times, want once:\n%s", n, out)
	}
	checkLogFragments(t, out, [][]string{{
		`level=ERROR msg="phase ended" phase=store state=failed`, why,
		"level=ERROR msg=lifecycle state=failed from=starting phase=store",
		"level=ERROR msg=\"startup failed\" phase=store",
		"level=ERROR msg=\"exiting after a failure\" phase=store exit_code=1",
	}, {`level=INFO msg="phase ended" phase=cache state=cancelled`, `reason="phase store failed"`}}, nil)
}
