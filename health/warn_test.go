package health_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/health/internal/healthtest"
	"github.com/phasegate/phasegate/health/sdnotify"
	"github.com/phasegate/phasegate/lifecycle"
)

// warnRig is a serving lifecycle whose phase populate deferred the
// background task "reclaim-dead", which reclaims 100000 namespaces a few
// per millisecond until the test ends it.
func warnRig(t *testing.T) *lifecycle.Lifecycle {
	t.Helper()
	stop := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name: "populate",
		Run: func(_ context.Context, p *lifecycle.Progress) error {
			p.Defer("reclaim-dead", func(ctx context.Context, p *lifecycle.Progress) error {
				p.SetTotal(100000, "namespaces")
				tick := time.NewTicker(2 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return nil
					case <-ctx.Done():
						return nil
					case <-tick.C:
						p.Add(5)
					}
				}
			})
			return nil
		},
	}}, lifecycle.WithProgressInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(stop)
		_ = lc.Drain(context.Background())
	})
	return lc
}

// Warnings leave the daemon serving in every dialect and say what is
// wrong: /health is 200 "warn" with a check per warning, the kube-style
// endpoints pass and list them, gRPC stays SERVING and sd_notify's STATUS
// names them; the warning named like a running background task carries its
// progress, rate and time left.
func TestWarnings(t *testing.T) {
	ns := healthtest.ListenNotify(t)
	lc := warnRig(t)
	c := health.New(lc, health.Options{})
	t.Cleanup(c.Close)
	cl := grpcHealth(t, c)
	h := health.NewHandler(c)
	n, err := sdnotify.New(lc, sdnotify.Options{StatusInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ns.WaitLine(t, "READY=1", func(l string) bool { return l == "READY=1" })

	lc.Warn("egress", "net.ipv4.ip_forward is 0")
	lc.Warn("reclaim-dead", "dead slots left from the last run")
	egressSince := lc.Snapshot().Warnings[0].Since

	// The task's rate and time left are known once its samples span a
	// few hundred milliseconds.
	rated := regexp.MustCompile(`^reclaim-dead: dead slots left from the last run \(\d+/100000 namespaces, [0-9.]+/s, ~[0-9.hms]+ left\)$`)
	var doc warnDoc
	var code int
	healthtest.Eventually(t, "a rate in the warning's check", func() bool {
		time.Sleep(20 * time.Millisecond)
		w := get(h, http.MethodGet, health.PathHealth)
		code, doc = w.Code, decodeWarnDoc(t, w)
		c := doc.Checks["warning:reclaim-dead"]
		return len(c) == 1 && c[0].Rate > 0 && c[0].ETA != ""
	})
	if code != http.StatusOK || doc.Status != "warn" {
		t.Errorf("/health = %d status %q, want 200 warn", code, doc.Status)
	}
	const prefix = "serving; 2 warnings: egress: net.ipv4.ip_forward is 0; reclaim-dead: dead slots left from the last run ("
	if !strings.HasPrefix(doc.Output, prefix) {
		t.Errorf("/health output %q, want it to start %q", doc.Output, prefix)
	}
	if e := doc.Checks["warning:egress"]; len(e) != 1 || e[0].ComponentType != "warning" || e[0].Status != "warn" ||
		e[0].Output != "net.ipv4.ip_forward is 0" || !e[0].Time.Equal(egressSince) || e[0].ObservedValue != nil {
		t.Errorf("warning:egress = %+v (since %v)", e, egressSince)
	}
	if r := doc.Checks["warning:reclaim-dead"][0]; r.Status != "warn" || r.Output != "dead slots left from the last run" ||
		r.ObservedValue == nil || *r.ObservedValue == 0 || r.ObservedUnit != "namespaces" || r.ObservedTotal != 100000 {
		t.Errorf("warning:reclaim-dead = %+v", r)
	}

	checkKubeEndpointsPassWithWarnings(t, h)
	if ok, why := c.Ready(); !ok || !strings.HasPrefix(why, prefix) {
		t.Errorf("Ready() = %v, %q", ok, why)
	}
	wantStatus(t, cl, "", serving)

	// STATUS names both, with the task's rate and time left.
	status := regexp.MustCompile(`^STATUS=serving; 2 warnings: egress: net.ipv4.ip_forward is 0; reclaim-dead: dead slots left from the last run \(\d+/100000 namespaces, [0-9.]+/s, ~[0-9.hms]+ left\)$`)
	ns.WaitLine(t, "naming the warnings", status.MatchString)
	if !rated.MatchString(strings.SplitN(doc.Output, "; ", 3)[2]) {
		t.Errorf("/health output %q: the task's part lacks its rate", doc.Output)
	}

	lc.ClearWarning("egress")
	lc.ClearWarning("reclaim-dead")
	ns.WaitLine(t, "without warnings", func(l string) bool { return l == "STATUS=serving" })
	w := get(h, http.MethodGet, health.PathHealth)
	if doc := decodeWarnDoc(t, w); w.Code != http.StatusOK || doc.Status != "pass" || doc.Output != "" || len(doc.Checks) != 2 {
		t.Errorf("/health once cleared = %d %+v", w.Code, doc)
	}
}

// checkKubeEndpointsPassWithWarnings checks that /livez, /readyz and
// /startupz pass while TestWarnings' two warnings are set, listing them
// when verbose.
func checkKubeEndpointsPassWithWarnings(t *testing.T, h http.Handler) {
	t.Helper()
	for _, tt := range []struct {
		target string
		want   []string // in order
	}{
		{"/readyz", []string{"ok"}},
		{"/livez", []string{"ok"}},
		{"/readyz?verbose", []string{"[+]lifecycle ok", "[+]phase/populate ok", "[+]warning/egress warn: net.ipv4.ip_forward is 0",
			"[+]warning/reclaim-dead warn: dead slots left from the last run (", "/100000 namespaces", "readyz check passed"}},
		{"/livez?verbose", []string{"[+]lifecycle ok", "[+]warning/egress warn: net.ipv4.ip_forward is 0", "livez check passed"}},
		{"/readyz/warning/egress", []string{"warn: net.ipv4.ip_forward is 0"}},
		{"/readyz?verbose&exclude=warning/egress", []string{"[+]warning/egress excluded: ok", "readyz check passed"}},
		{"/startupz", []string{"ok"}},
	} {
		w := get(h, http.MethodGet, tt.target)
		body := w.Body.String()
		if w.Code != http.StatusOK {
			t.Errorf("GET %s = %d, want 200\n%s", tt.target, w.Code, body)
		}
		rest := body
		for _, line := range tt.want {
			i := strings.Index(rest, line)
			if i < 0 {
				t.Errorf("GET %s: body lacks %q (in order)\n%s", tt.target, line, body)
				break
			}
			rest = rest[i+len(line):]
		}
	}
}

// warnDoc is the part of a /health body the warning tests read.
type warnDoc struct {
	Status string `json:"status"`
	Output string `json:"output"`
	Checks map[string][]struct {
		ComponentType string    `json:"componentType"`
		Status        string    `json:"status"`
		State         string    `json:"state"`
		Time          time.Time `json:"time"`
		Output        string    `json:"output"`
		ObservedValue *int64    `json:"observedValue"`
		ObservedUnit  string    `json:"observedUnit"`
		ObservedTotal int64     `json:"observedTotal"`
		Rate          float64   `json:"rate"`
		ETA           string    `json:"eta"`
	} `json:"checks"`
}

func decodeWarnDoc(t *testing.T, w *httptest.ResponseRecorder) warnDoc {
	t.Helper()
	var doc warnDoc
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
		t.Fatalf("body is not JSON: %v\n%s", err, w.Body)
	}
	return doc
}
