package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/health/internal/healthtest"
	"github.com/phasegate/phasegate/lifecycle"
)

// get runs one request against h and returns the recorded answer.
func get(h http.Handler, method, target string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(method, target, nil))
	return w
}

// rigIn returns a rig driven to the named lifecycle state and a handler
// for it.
func rigIn(t *testing.T, state lifecycle.State) (*healthtest.Rig, *health.Checker, *health.Handler) {
	t.Helper()
	r := healthtest.NewRig(t, state == lifecycle.StateFailed)
	c := health.New(r.LC, health.Options{Version: "1.2.3"})
	t.Cleanup(c.Close)
	switch state {
	case lifecycle.StateCreated:
	case lifecycle.StateStarting:
		r.Start(t)
	case lifecycle.StateServing:
		r.Start(t)
		if err := r.Serve(t); err != nil {
			t.Fatal(err)
		}
	case lifecycle.StateDraining:
		r.Start(t)
		if err := r.Serve(t); err != nil {
			t.Fatal(err)
		}
		r.Drain(t)
	case lifecycle.StateFailed:
		r.Start(t)
		if err := r.Serve(t); err == nil {
			t.Fatal("start succeeded, want a failure")
		}
	}
	if got := r.LC.State(); got != state {
		t.Fatalf("lifecycle is %s, want %s", got, state)
	}
	return r, c, health.NewHandler(c)
}

func TestHandlerStatusCodes(t *testing.T) {
	const ok, unavailable = http.StatusOK, http.StatusServiceUnavailable
	tests := []struct {
		state                           lifecycle.State
		health, livez, readyz, startupz int
	}{
		{lifecycle.StateCreated, unavailable, ok, unavailable, unavailable},
		{lifecycle.StateStarting, unavailable, ok, unavailable, unavailable},
		{lifecycle.StateServing, ok, ok, ok, ok},
		{lifecycle.StateDraining, unavailable, ok, unavailable, ok},
		{lifecycle.StateFailed, unavailable, unavailable, unavailable, unavailable},
	}
	for _, tt := range tests {
		t.Run(string(tt.state), func(t *testing.T) {
			_, _, h := rigIn(t, tt.state)
			for path, want := range map[string]int{
				health.PathHealth:   tt.health,
				health.PathLivez:    tt.livez,
				health.PathReadyz:   tt.readyz,
				health.PathStartupz: tt.startupz,
			} {
				for _, method := range []string{http.MethodGet, http.MethodHead} {
					w := get(h, method, path)
					if w.Code != want {
						t.Errorf("%s %s = %d, want %d\n%s", method, path, w.Code, want, w.Body)
					}
					if cc := w.Header().Get("Cache-Control"); cc != "no-store" {
						t.Errorf("%s %s: Cache-Control %q", method, path, cc)
					}
					if method == http.MethodHead && w.Body.Len() != 0 {
						t.Errorf("HEAD %s has a body: %q", path, w.Body)
					}
				}
			}
		})
	}
}

// healthDoc is the part of an application/health+json body the tests read.
type healthDoc struct {
	Status  string    `json:"status"`
	Version string    `json:"version"`
	Output  string    `json:"output"`
	State   string    `json:"state"`
	Since   time.Time `json:"since"`
	Checks  map[string][]struct {
		ComponentType string    `json:"componentType"`
		Status        string    `json:"status"`
		State         string    `json:"state"`
		Time          time.Time `json:"time"`
		Duration      string    `json:"duration"`
		ObservedValue *int64    `json:"observedValue"`
		ObservedUnit  string    `json:"observedUnit"`
		ObservedTotal int64     `json:"observedTotal"`
		Output        string    `json:"output"`
		WorstCase     string    `json:"worstCase"`
	} `json:"checks"`
}

func decodeHealth(t *testing.T, w *httptest.ResponseRecorder) healthDoc {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/health+json" {
		t.Errorf("Content-Type %q, want application/health+json", ct)
	}
	var doc healthDoc
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
		t.Fatalf("body is not JSON: %v\n%s", err, w.Body)
	}
	return doc
}

func TestHandlerHealthJSONStarting(t *testing.T) {
	_, _, h := rigIn(t, lifecycle.StateStarting)
	w := get(h, http.MethodGet, "/health")
	doc := decodeHealth(t, w)
	if doc.Status != "fail" || doc.Version != "1.2.3" || doc.State != "starting" || doc.Since.IsZero() {
		t.Errorf("status %q version %q state %q since %v", doc.Status, doc.Version, doc.State, doc.Since)
	}
	if want := "starting: phase reclaim 1200/5000 namespaces"; doc.Output != want {
		t.Errorf("output %q, want %q", doc.Output, want)
	}
	if len(doc.Checks) != 4 {
		t.Errorf("checks %v, want one per phase", doc.Checks)
	}
	rc := doc.Checks["phase:reclaim"]
	if len(rc) != 1 {
		t.Fatalf("phase:reclaim = %v", rc)
	}
	c := rc[0]
	if c.ComponentType != "phase" || c.Status != "warn" || c.State != "running" ||
		c.ObservedValue == nil || *c.ObservedValue != 1200 || c.ObservedUnit != "namespaces" ||
		c.ObservedTotal != 5000 || c.Time.IsZero() || c.Duration == "" {
		t.Errorf("phase:reclaim = %+v", c)
	}
	if l := doc.Checks["phase:lock"]; len(l) != 1 || l[0].Status != "pass" || l[0].State != "succeeded" {
		t.Errorf("phase:lock = %+v", l)
	}
	if s := doc.Checks["phase:serve"]; len(s) != 1 || s[0].Status != "warn" || s[0].State != "pending" {
		t.Errorf("phase:serve = %+v", s)
	}
}

func TestHandlerHealthJSONServingAndFailed(t *testing.T) {
	_, _, h := rigIn(t, lifecycle.StateServing)
	doc := decodeHealth(t, get(h, http.MethodGet, "/health"))
	if doc.Status != "pass" || doc.State != "serving" || doc.Output != "" {
		t.Errorf("serving: %+v", doc)
	}
	for name, c := range doc.Checks {
		if c[0].Status != "pass" {
			t.Errorf("serving: %s = %+v", name, c[0])
		}
	}

	_, _, h = rigIn(t, lifecycle.StateFailed)
	doc = decodeHealth(t, get(h, http.MethodGet, "/health"))
	if doc.Status != "fail" || doc.State != "failed" ||
		doc.Output != `failed: phase "reclaim" failed after 1 attempt: netns dir unreadable` {
		t.Errorf("failed: %+v", doc)
	}
	if c := doc.Checks["phase:reclaim"][0]; c.Status != "fail" || c.Output != "failed: netns dir unreadable" {
		t.Errorf("failed: phase:reclaim = %+v", c)
	}
	if c := doc.Checks["phase:serve"][0]; c.Status != "fail" || c.State != "skipped" {
		t.Errorf("failed: phase:serve = %+v", c)
	}
}

func TestHandlerHealthJSONDegraded(t *testing.T) {
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name: "populate",
		Run: func(_ context.Context, p *lifecycle.Progress) error {
			p.Defer("fill", func(context.Context, *lifecycle.Progress) error { return errors.New("pool full") })
			return nil
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Drain(context.Background()) })
	c := health.New(lc, health.Options{})
	t.Cleanup(c.Close)
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	healthtest.Eventually(t, "the task to fail", func() bool { return lc.Snapshot().Degraded })
	w := get(health.NewHandler(c), http.MethodGet, "/health")
	doc := decodeHealth(t, w)
	if w.Code != http.StatusOK || doc.Status != "warn" || doc.Output != "serving, degraded: task fill: pool full" {
		t.Errorf("degraded: %d %+v", w.Code, doc)
	}
	if c := doc.Checks["task:fill"]; len(c) != 1 || c[0].Status != "warn" || c[0].State != "failed" || c[0].Output != "pool full" {
		t.Errorf("task:fill = %+v", c)
	}
}

func TestHandlerKubeChecks(t *testing.T) {
	_, _, starting := rigIn(t, lifecycle.StateStarting)
	_, _, serving := rigIn(t, lifecycle.StateServing)
	_, _, draining := rigIn(t, lifecycle.StateDraining)
	tests := []struct {
		name   string
		h      http.Handler
		target string
		code   int
		want   []string // lines the body contains, in order
		not    []string
	}{
		{"passing is terse", serving, "/readyz", 200, []string{"ok"}, []string{"[+]"}},
		{"verbose lists checks", serving, "/readyz?verbose", 200,
			[]string{"[+]lifecycle ok", "[+]phase/lock ok", "[+]phase/listen ok", "[+]phase/reclaim ok", "[+]phase/serve ok", "readyz check passed"}, nil},
		{"failure always lists", starting, "/readyz", 503,
			[]string{"[-]lifecycle starting: phase reclaim 1200/5000 namespaces", "[+]phase/lock ok", "[-]phase/reclaim running: 1200/5000 namespaces", "[-]phase/serve pending", "readyz check failed"}, nil},
		{"verbose failure", starting, "/startupz?verbose=1", 503,
			[]string{"[+]phase/lock ok", "[-]phase/reclaim running: 1200/5000 namespaces", "startupz check failed"}, nil},
		{"exclude", starting, "/startupz?exclude=lifecycle&exclude=phase/reclaim&exclude=phase/serve", 200, []string{"ok"}, []string{"[-]"}},
		{"exclude verbose, comma list", starting, "/startupz?verbose&exclude=lifecycle,phase/reclaim,phase/serve", 200,
			[]string{"[+]lifecycle excluded: ok", "[+]phase/lock ok", "[+]phase/reclaim excluded: ok", "startupz check passed"}, nil},
		{"exclude one of several failures", starting, "/startupz?exclude=phase/reclaim", 503,
			[]string{"[-]lifecycle", "[+]phase/reclaim excluded: ok", "[-]phase/serve pending", "startupz check failed"}, nil},
		{"exclude unknown", serving, "/livez?verbose&exclude=nope", 200,
			[]string{"[+]lifecycle ok", `warn: some health checks cannot be excluded: no matches for "nope"`, "livez check passed"}, nil},
		{"livez has no phase checks", starting, "/livez?verbose", 200, []string{"[+]lifecycle ok", "livez check passed"}, []string{"phase/"}},
		{"startupz while draining", draining, "/startupz", 200, []string{"ok"}, nil},
		{"readyz while draining", draining, "/readyz", 503, []string{"[-]lifecycle draining", "readyz check failed"}, nil},
		{"one check passing", starting, "/readyz/phase/lock", 200, []string{"ok"}, nil},
		{"one check failing", starting, "/startupz/phase/reclaim", 503, []string{"[-]phase/reclaim running: 1200/5000 namespaces"}, nil},
		{"one unknown check", starting, "/readyz/phase/nope", 404, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := get(tt.h, http.MethodGet, tt.target)
			body := w.Body.String()
			if w.Code != tt.code {
				t.Errorf("GET %s = %d, want %d\n%s", tt.target, w.Code, tt.code, body)
			}
			if ct := w.Header().Get("Content-Type"); ct != "text/plain; charset=utf-8" {
				t.Errorf("Content-Type %q", ct)
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
			for _, s := range tt.not {
				if strings.Contains(body, s) {
					t.Errorf("GET %s: body has %q\n%s", tt.target, s, body)
				}
			}
		})
	}
}

func TestHandlerMethodsAndPaths(t *testing.T) {
	_, _, h := rigIn(t, lifecycle.StateServing)
	mux := http.NewServeMux()
	h.Mount(mux)
	for _, handler := range []http.Handler{h, mux} {
		for _, tt := range []struct {
			method, target string
			code           int
		}{
			{http.MethodGet, "/health", 200},
			{http.MethodHead, "/readyz", 200},
			{http.MethodPost, "/health", 405},
			{http.MethodDelete, "/livez", 405},
			{http.MethodPut, "/readyz/phase/lock", 405},
			{http.MethodGet, "/healthz", 404},
			{http.MethodGet, "/", 404},
			{http.MethodGet, "/health/x", 404},
			{http.MethodGet, "/readyzz", 404},
		} {
			w := get(handler, tt.method, tt.target)
			if w.Code != tt.code {
				t.Errorf("%T: %s %s = %d, want %d", handler, tt.method, tt.target, w.Code, tt.code)
			}
			if tt.code == 405 && w.Header().Get("Allow") != "GET, HEAD" {
				t.Errorf("%s %s: Allow %q", tt.method, tt.target, w.Header().Get("Allow"))
			}
		}
	}
}

// TestHandlerHealthAnswerReused checks the compact /health cache: the same
// bytes while nothing changed, a new answer once it is HealthMaxAge old,
// and never an answer behind a change of state or a checker's shutdown.
func TestHandlerHealthAnswerReused(t *testing.T) {
	r, c, h := rigIn(t, lifecycle.StateStarting)

	// The running reclaim's "time" is the time of the answer: two renders
	// differ in it, a reused answer does not. Two requests far enough
	// apart on a busy machine, or with a change published between them
	// (the reclaim's progress, throttled, may be published a moment after
	// the rig returns), may rightly get two renders; one pair in five
	// close together with no change between must get one.
	reused := false
	for range 5 {
		t0, seq := time.Now(), r.LC.Seq()
		a, b := get(h, http.MethodGet, "/health").Body.String(), get(h, http.MethodGet, "/health").Body.String()
		if time.Since(t0) < health.HealthMaxAge/4 && r.LC.Seq() == seq {
			reused = a == b
			if !reused {
				t.Fatalf("two answers %s apart differ:\n%s\n%s", time.Since(t0), a, b)
			}
			break
		}
	}
	if !reused {
		t.Fatal("no two requests came within a quarter of HealthMaxAge")
	}

	first := decodeHealth(t, get(h, http.MethodGet, "/health")).Checks["phase:reclaim"][0].Time
	time.Sleep(health.HealthMaxAge + 10*time.Millisecond)
	if later := decodeHealth(t, get(h, http.MethodGet, "/health")).Checks["phase:reclaim"][0].Time; !later.After(first) {
		t.Errorf("after HealthMaxAge the reclaim's time is still %v", later)
	}

	// A change is seen by the next request, however soon.
	get(h, http.MethodGet, "/health")
	if err := r.Serve(t); err != nil {
		t.Fatal(err)
	}
	if w := get(h, http.MethodGet, "/health"); w.Code != http.StatusOK || decodeHealth(t, w).State != "serving" {
		t.Fatalf("right after serving: %d %s", w.Code, w.Body)
	}
	c.Shutdown()
	if w := get(h, http.MethodGet, "/health"); w.Code != http.StatusServiceUnavailable || decodeHealth(t, w).State != "draining" {
		t.Fatalf("right after the checker's shutdown: %d %s", w.Code, w.Body)
	}
}
