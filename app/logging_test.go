package app

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

func TestEventLoggerLogsEveryPhaseOnce(t *testing.T) {
	var buf lockedBuffer
	hook, setLC := EventLogger(slog.New(slog.NewTextHandler(&buf, nil)))
	logged := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: func(context.Context, *lifecycle.Progress) error { return nil }},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(3, "namespaces")
			p.Add(3)
			p.Defer("rest", func(context.Context, *lifecycle.Progress) error { return errors.New("stuck") })
			return nil
		}},
		{Name: "serve", DependsOn: []string{"reclaim"}, Run: func(context.Context, *lifecycle.Progress) error { return nil }},
	}, lifecycle.WithEventHook(func(e lifecycle.Event) {
		hook(e)
		if e.Final() {
			close(logged)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	setLC(lc)
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := lc.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-logged
	out := buf.String()
	for _, want := range []string{
		`msg="phase started" phase=lock`,
		`msg="phase ended" phase=reclaim state=succeeded`,
		`progress="3/3 namespaces"`,
		`msg=lifecycle state=serving from=starting`,
		`msg=lifecycle state=stopped from=draining`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	for _, phase := range []string{"lock", "reclaim", "serve"} {
		if n := strings.Count(out, `msg="phase ended" phase=`+phase+" "); n != 1 {
			t.Errorf("phase %s ended %d times in the log", phase, n)
		}
	}
}

// A phase that panics is logged with the panic's stack.
func TestEventLoggerLogsAPanicsStack(t *testing.T) {
	var buf lockedBuffer
	hook, setLC := EventLogger(slog.New(slog.NewTextHandler(&buf, nil)))
	logged := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "migrate", Run: func(context.Context, *lifecycle.Progress) error { panic("schema drift") }},
	}, lifecycle.WithEventHook(func(e lifecycle.Event) {
		hook(e)
		if e.Final() {
			close(logged)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	setLC(lc)
	if err := lc.Start(context.Background()); err == nil {
		t.Fatal("a panicking phase started")
	}
	if err := lc.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-logged
	out := buf.String()
	if !strings.Contains(out, "panic: schema drift") || !strings.Contains(out, "stack=") || !strings.Contains(out, "logging_test.go") {
		t.Fatalf("the panic is logged without its stack:\n%s", out)
	}
}

// etaOrAverage falls back on the average since the phase started while the
// estimator states no rate yet, and keeps the estimate once it does.
func TestETAOrAverage(t *testing.T) {
	started := time.Now().Add(-2 * time.Second)
	p := lifecycle.PhaseSnapshot{
		Name: "reclaim", State: lifecycle.PhaseRunning, Attempts: 1, Started: started,
		Progress: lifecycle.ProgressSnapshot{Done: 100, Total: 300},
	}
	if e := etaOrAverage(p); !e.OK || e.Rate <= 0 || e.Rate > 50 || e.Remaining < 4*time.Second {
		t.Errorf("no estimate yet: %+v, want about 50/s and about 4s left", e)
	}
	p.ETA = lifecycle.Estimate{Rate: 200, Remaining: time.Second, OK: true}
	if e := etaOrAverage(p); e != p.ETA {
		t.Errorf("with an estimate: %+v, want %+v", e, p.ETA)
	}
}
