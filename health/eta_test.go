package health_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/health/internal/healthtest"
	"github.com/phasegate/phasegate/health/sdnotify"
	"github.com/phasegate/phasegate/lifecycle"
)

// steadyPhase returns a lifecycle whose one phase counts to 100000
// namespaces, a few per millisecond, until released.
func steadyPhase(t *testing.T) (lc *lifecycle.Lifecycle, release func()) {
	t.Helper()
	stop := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name: "reclaim",
		Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(100000, "namespaces")
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				case <-tick.C:
					p.Add(5)
				}
			}
		},
	}}, lifecycle.WithProgressInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- lc.Start(context.Background()) }()
	var once atomic.Bool
	release = func() {
		if once.CompareAndSwap(false, true) {
			close(stop)
			if err := healthtest.Recv(t, started, "start"); err != nil {
				t.Error(err)
			}
			_ = lc.Drain(context.Background())
		}
	}
	t.Cleanup(release)
	return lc, release
}

// etaCheck is the rate and time left of the check phase:reclaim.
type etaCheck struct {
	Rate       float64 `json:"rate"`
	ETA        string  `json:"eta"`
	ETASeconds float64 `json:"etaSeconds"`
}

func decodeETA(t *testing.T, w *httptest.ResponseRecorder) etaCheck {
	t.Helper()
	var doc struct {
		Checks map[string][]etaCheck `json:"checks"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil || len(doc.Checks["phase:reclaim"]) != 1 {
		t.Fatalf("body: %v\n%s", err, w.Body)
	}
	return doc.Checks["phase:reclaim"][0]
}

// The /health body gives a running phase's rate and time left, and the
// counts served are reported through OnHTTPCheck.
func TestHealthJSONHasETA(t *testing.T) {
	lc, release := steadyPhase(t)
	var served atomic.Int64
	c := health.New(lc, health.Options{OnHTTPCheck: func(path string, code int) {
		if path == health.PathHealth && code == http.StatusServiceUnavailable {
			served.Add(1)
		}
	}})
	defer c.Close()
	h := health.NewHandler(c)
	var last etaCheck
	healthtest.Eventually(t, "a rate and an eta in phase:reclaim", func() bool {
		time.Sleep(20 * time.Millisecond)
		last = decodeETA(t, get(h, http.MethodGet, "/health"))
		return last.Rate > 0 && last.ETA != "" && last.ETASeconds > 0
	})
	if _, err := time.ParseDuration(last.ETA); err != nil {
		t.Errorf("eta %q is not a duration: %v", last.ETA, err)
	}
	if served.Load() < 2 {
		t.Errorf("OnHTTPCheck saw %d /health answers", served.Load())
	}
	release()
	if c := decodeETA(t, get(h, http.MethodGet, "/health")); c.Rate <= 0 || c.ETA != "" {
		t.Errorf("finished phase: rate %v eta %q, want an average rate and no eta", c.Rate, c.ETA)
	}
}

// STATUS= lines carry the rate and time left once they are known.
func TestNotifierStatusHasETA(t *testing.T) {
	ns := healthtest.ListenNotify(t)
	lc, release := steadyPhase(t)
	n, err := sdnotify.New(lc, sdnotify.Options{StatusInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	re := regexp.MustCompile(`^STATUS=starting: phase reclaim \d+/100000 namespaces \([0-9.]+/s, ~[0-9.hms]+ left\)$`)
	ns.WaitLine(t, "with a rate and time left", re.MatchString)
	release()
}
