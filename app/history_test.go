package app

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/lifecycle/history"
)

// The start history end to end in process: four starts whose reclaim
// takes a few milliseconds over 10 namespaces, then one of 800ms over
// 5,000. The fifth start's reclaim is flagged slow in the log, naming the
// phase, its figure and the usual, in /health beside its duration, and on
// its span; the history file keeps the five starts.
//
// With HistoryAfter naming reclaim, the history is read only once reclaim
// succeeded, after its span may have ended: the start's own span still
// names it among the steps slower than usual.
func TestStartHistoryFlagsASlowStart(t *testing.T) {
	for _, after := range []string{"", "reclaim"} {
		t.Run("after="+after, func(t *testing.T) { testStartHistoryFlagsASlowStart(t, after) })
	}
}

func testStartHistoryFlagsASlowStart(t *testing.T, after string) {
	path := filepath.Join(t.TempDir(), "starts.json")
	spans := tracetest.NewSpanRecorder()
	run := func(took time.Duration, total int64) (log string, body []byte) {
		t.Helper()
		var buf lockedBuffer
		cfg := DefaultConfig("runner", "127.0.0.1:0")
		cfg.DrainDelay, cfg.History, cfg.HistoryAfter = 0, path, after
		cfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
		cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
		a, err := New(cfg, lifecycle.Phase{Name: "reclaim", Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(total, "namespaces")
			time.Sleep(took)
			p.SetDone(total)
			return nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get("http://" + a.Addr(context.Background()).String() + "/health")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := a.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		return buf.String(), body
	}
	for range 4 {
		if log, _ := run(5*time.Millisecond, 10); strings.Contains(log, "slower than usual") {
			t.Fatalf("a usual start flagged slow:\n%s", log)
		}
	}
	log, body := run(800*time.Millisecond, 5000)
	if !strings.Contains(log, `msg="phase slower than usual" phase=reclaim`) || !strings.Contains(log, "over the last 4 starts, ~10 namespaces") || !strings.Contains(log, `progress="5000/5000 namespaces"`) {
		t.Errorf("the slow start's log does not flag reclaim with its figures:\n%s", log)
	}
	var h struct {
		Checks map[string][]struct {
			Usual string `json:"usual"`
			Slow  bool   `json:"slow"`
		} `json:"checks"`
	}
	if err := json.Unmarshal(body, &h); err != nil {
		t.Fatal(err)
	}
	if c := h.Checks["phase:reclaim"]; len(c) != 1 || !c[0].Slow || !strings.HasPrefix(c[0].Usual, "usually ") {
		t.Errorf("/health's reclaim check: %+v, want it slow beside its usual\n%s", c, body)
	}
	var slow, startSlow []string
	for _, sp := range spans.Ended() {
		for _, kv := range sp.Attributes() {
			switch {
			case kv.Key == "phasegate.slower_than_usual" && kv.Value.AsBool():
				slow = append(slow, sp.Name())
			case kv.Key == "phasegate.start.slower_than_usual" && sp.Name() == "startup":
				startSlow = append(startSlow, kv.Value.AsStringSlice()...)
			}
		}
	}
	if after == "" && (len(slow) != 1 || slow[0] != "phase reclaim") {
		t.Errorf("spans flagged slower than usual: %v, want the fifth start's reclaim alone", slow)
	}
	if len(startSlow) != 1 || !strings.HasPrefix(startSlow[0], "phase reclaim took 8") || !strings.Contains(startSlow[0], "ms, usually ") || !strings.HasSuffix(startSlow[0], "over the last 4 starts, ~10 namespaces") {
		t.Errorf("the starts' spans name as slower than usual %q, want the fifth's reclaim alone with its figures", startSlow)
	}
	l, err := history.Open(path, 0)
	if err != nil || len(l.Starts()) != 5 {
		t.Fatalf("the history file: %v, %d starts, want 5", err, len(l.Starts()))
	}
	if last := l.Starts()[4]; last.Outcome != "serving" || len(last.Steps) == 0 {
		t.Errorf("the last start kept: %+v", last)
	}
}

// With HistoryAfter, the history's file is touched only once that phase
// succeeded: a start whose lock phase failed writes nothing, one whose
// lock succeeded is kept.
func TestStartHistoryAfterAPhase(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lockErr error
		kept    int
	}{
		{"lock failed", lifecycle.Permanent(errors.New("state directory not root's")), 0},
		{"lock succeeded", nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "starts.json")
			cfg := DefaultConfig("runner", "127.0.0.1:0")
			cfg.DrainDelay, cfg.History, cfg.HistoryAfter = 0, path, "lock"
			a, err := New(cfg, lifecycle.Phase{Name: "lock", Run: func(context.Context, *lifecycle.Progress) error { return tc.lockErr }})
			if err != nil {
				t.Fatal(err)
			}
			_ = a.Start(context.Background())
			_ = a.Stop(context.Background())
			_, statErr := os.Stat(path)
			if tc.kept == 0 && !errors.Is(statErr, os.ErrNotExist) {
				t.Errorf("the history file exists after the lock phase failed: %v", statErr)
			}
			if l, _ := history.Open(path, 0); len(l.Starts()) != tc.kept {
				t.Errorf("%d starts kept, want %d", len(l.Starts()), tc.kept)
			}
		})
	}
	cfg := DefaultConfig("runner", "127.0.0.1:0")
	cfg.History, cfg.HistoryAfter = filepath.Join(t.TempDir(), "starts.json"), "lokc"
	if _, err := New(cfg, lifecycle.Phase{Name: "lock", Run: nop}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "lokc") {
		t.Errorf("New with HistoryAfter naming no phase: %v", err)
	}
}
