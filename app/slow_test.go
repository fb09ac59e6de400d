package app

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A phase that runs past its expected duration is logged once per
// expected duration, with its progress and rate; one that is quick is not.
func TestWarnSlowPhases(t *testing.T) {
	release := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: func(context.Context, *lifecycle.Progress) error { return nil }},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(100000, "namespaces")
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-release:
					return nil
				case <-tick.C:
					p.Add(10)
				}
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	stop := WarnSlowPhases(lc, log, map[string]time.Duration{"reclaim": 400 * time.Millisecond, "lock": time.Hour})
	defer stop()
	started := make(chan error, 1)
	go func() { started <- lc.Start(context.Background()) }()
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(logs.String(), "phase slower than expected") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no two warnings; logs:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(release)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	stop()
	out := logs.String()
	first := strings.Split(out, "\n")[0]
	for _, want := range []string{"level=WARN", "phase=reclaim", "expected=400ms", "progress=", "/100000 namespaces", "rate=", "eta="} {
		if !strings.Contains(first, want) {
			t.Errorf("warning %q lacks %q", first, want)
		}
	}
	if strings.Contains(out, "phase=lock") {
		t.Errorf("a quick phase was warned about:\n%s", out)
	}
	_ = lc.Drain(context.Background())
}
