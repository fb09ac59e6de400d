package health

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/phasegate/phasegate/internal/eta"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/lifecycle/history"
)

// HTTP paths served by a [Handler].
const (
	// PathHealth answers Nomad and Consul HTTP checks: 200 when serving,
	// 503 otherwise, with an application/health+json body.
	PathHealth = "/health"
	// PathLivez is 200 unless the lifecycle failed.
	PathLivez = "/livez"
	// PathReadyz is 200 only while the daemon serves.
	PathReadyz = "/readyz"
	// PathStartupz is 200 once startup completed, draining included.
	PathStartupz = "/startupz"
)

// Handler serves the HTTP health endpoints from a [Checker]'s view:
//
//   - /health: status 200 when serving and 503 otherwise (never 429), with a
//     body in the IETF health-check format (draft-inadarei-api-health-check,
//     media type application/health+json; compact, "?pretty" indents it):
//     status pass, warn (serving, still 200, but a background task failed
//     or a warning is set) or fail; version; output saying why the daemon is
//     not ready ("starting: phase reclaim 1200/5000 namespaces (812/s, ~4.7s
//     left)", in the words of [DescribeWithETA]) or what it warns of
//     ("serving; 1 warning: egress: net.ipv4.ip_forward is 0");
//     checks keyed "phase:<name>", "task:<name>" and "warning:<name>"; the
//     lifecycle state and since when; last, "verdict" repeats output (cut
//     to 1 KiB) and status, so that a checker that keeps only the end of a
//     long body (Consul: the last 4 KiB) still reads them.
//   - /livez, /readyz, /startupz: kube-apiserver semantics. The checks are
//     "lifecycle" and, for /readyz and /startupz, "phase/<name>" per phase;
//     /livez and /readyz add "warning/<name>" per warning, which never
//     fails. "?verbose" lists them ("[+]phase/lock ok", "[-]phase/reclaim
//     running: 1200/5000 namespaces", "[+]warning/egress warn:
//     net.ipv4.ip_forward is 0"), a failure always does; "?exclude=<check>"
//     (repeatable) leaves a check out; "/readyz/<check>" runs one check.
//
// Only GET and HEAD are allowed (405 otherwise); other paths are 404; every
// answer carries Cache-Control: no-store. A Handler never answers 500 and
// never panics: a failure to render is a 503.
//
// Rates and times left in /health are those the lifecycle's snapshot
// carries, the same that STATUS=, the metrics, the log and the timeline
// show.
//
// The compact /health answer is rendered once per change the lifecycle
// publishes and reused, byte for byte, until the next one or until it is
// [HealthMaxAge] old, whichever comes first: checkers ask thousands of
// times for every change, and rendering and encoding the document per
// request was most of what a check cost the daemon under load
// (docs/BENCHMARKS.md, "Figures behind the network code"). A state
// change, a phase or task starting or ending, a warning, and a shutdown
// of the checker are each published or seen at once, so no answer is ever
// behind them; progress, rates and times lag by at most HealthMaxAge, as
// they do for every other observer of the lifecycle.
type Handler struct {
	c    *Checker
	last atomic.Pointer[healthAnswer] // the last compact /health answer rendered
}

// HealthMaxAge is how long a compact /health answer is served again while
// the lifecycle publishes nothing new: the lifecycle's own progress
// interval, so that its progress and times lag no more than they do in
// the gRPC statuses, STATUS= and the metrics.
const HealthMaxAge = lifecycle.DefaultProgressInterval

// healthAnswer is a rendered compact /health answer and what it was
// rendered from.
type healthAnswer struct {
	seq      uint64 // the snapshot's Seq
	shutdown bool   // whether the checker was shut down
	at       time.Time
	code     int
	body     []byte // shared by every request it answers: never modified
}

// NewHandler returns the HTTP endpoints of c.
func NewHandler(c *Checker) *Handler {
	return &Handler{c: c}
}

// Mount registers the handler's paths on mux.
func (h *Handler) Mount(mux *http.ServeMux) {
	mux.Handle(PathHealth, h)
	for _, p := range []string{PathLivez, PathReadyz, PathStartupz} {
		mux.Handle(p, h)
		mux.Handle(p+"/", h)
	}
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Content-Type-Options", "nosniff")

	endpoint, check, ok := splitPath(r.URL.Path)
	if !ok {
		http.Error(w, "404 page not found", http.StatusNotFound)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}

	code, ctype, body := h.render(endpoint, check, r)
	if f := h.c.opts.OnHTTPCheck; f != nil {
		f(endpoint, code)
	}
	hdr.Set("Content-Type", ctype)
	hdr.Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

// render builds a whole answer before anything is written, so that a
// failure can still become a clean 503.
func (h *Handler) render(endpoint, check string, r *http.Request) (code int, ctype string, body []byte) {
	defer func() {
		if v := recover(); v != nil {
			code, ctype = http.StatusServiceUnavailable, "text/plain; charset=utf-8"
			body = fmt.Appendf(nil, "health: internal error: %v\n", v)
		}
	}()
	if endpoint == PathHealth {
		if _, pretty := r.URL.Query()["pretty"]; pretty {
			return h.renderHealthJSON(h.c.view(), time.Now(), true)
		}
		return h.compactHealth(time.Now())
	}
	code, body = renderChecks(endpoint, check, h.c.view(), r.URL.Query())
	return code, "text/plain; charset=utf-8", body
}

// compactHealth answers /health from the last answer rendered while that
// is current (see [Handler]), and renders a new one otherwise. Two
// requests that miss at once may both render; the cache keeps either, and
// one older than the lifecycle's Seq is never served.
func (h *Handler) compactHealth(now time.Time) (int, string, []byte) {
	seq, shutdown := h.c.lc.Seq(), h.c.shutdown.Load()
	if a := h.last.Load(); a != nil && a.seq == seq && a.shutdown == shutdown && now.Sub(a.at) < HealthMaxAge {
		return a.code, ctypeHealthJSON, a.body
	}
	v := h.c.view()
	code, ctype, body := h.renderHealthJSON(v, now, false)
	if ctype == ctypeHealthJSON {
		h.last.Store(&healthAnswer{seq: v.snap.Seq, shutdown: v.shutdown, at: now, code: code, body: body})
	}
	return code, ctype, body
}

// splitPath maps a path to one of the endpoints and, for
// "/readyz/phase/lock", the check it names.
func splitPath(p string) (endpoint, check string, ok bool) {
	if p == PathHealth {
		return PathHealth, "", true
	}
	for _, e := range []string{PathLivez, PathReadyz, PathStartupz} {
		if p == e {
			return e, "", true
		}
		if rest, found := strings.CutPrefix(p, e+"/"); found && rest != "" {
			return e, rest, true
		}
	}
	return "", "", false
}

// healthBody is the application/health+json document.
type healthBody struct {
	Status      string                   `json:"status"`
	Version     string                   `json:"version,omitempty"`
	ServiceID   string                   `json:"serviceId,omitempty"`
	Description string                   `json:"description,omitempty"`
	Output      string                   `json:"output,omitempty"`
	State       lifecycle.State          `json:"state"`
	Since       time.Time                `json:"since"`
	Checks      map[string][]checkResult `json:"checks"`
	// Verdict repeats output and status last, so that a checker which keeps
	// only the end of a long body (Consul keeps the last 4 KiB) still shows
	// them; a checker that keeps the start has them at the top.
	Verdict verdict `json:"verdict"`
}

// verdict is the body's closing repeat of its verdict: output first, cut to
// maxVerdictOutput bytes, so that status is the body's last field and the
// whole verdict fits any checker's window.
type verdict struct {
	Output string `json:"output,omitempty"`
	Status string `json:"status"`
}

// maxVerdictOutput bounds the verdict's output: well under the 4 KiB that
// Consul keeps of a check's output, with room for its "HTTP GET <url>: 200
// OK Output: " prefix and the JSON around it.
const maxVerdictOutput = 1024

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// checkResult is one entry of "checks". The draft's fields come first;
// state, attempts, duration and observedTotal are this package's own. A
// warning has no state; while the background task named like it runs, its
// observed values, rate and time left are the task's.
type checkResult struct {
	ComponentType string    `json:"componentType"`
	Status        string    `json:"status"`
	Time          time.Time `json:"time"`
	ObservedValue *int64    `json:"observedValue,omitempty"`
	ObservedUnit  string    `json:"observedUnit,omitempty"`
	Output        string    `json:"output,omitempty"`
	State         string    `json:"state,omitempty"`
	Attempts      int       `json:"attempts,omitempty"`
	Duration      string    `json:"duration,omitempty"`
	ObservedTotal int64     `json:"observedTotal,omitempty"`
	// Rate is units of progress per second (recent while running, average
	// once done); ETA the estimated time left while running, also in
	// seconds as ETASeconds.
	Rate       float64 `json:"rate,omitempty"`
	ETA        string  `json:"eta,omitempty"`
	ETASeconds float64 `json:"etaSeconds,omitempty"`
	// Usual is what the step usually takes, from the start history
	// ("usually 310ms (280ms–350ms) over the last 20 starts, ~10
	// namespaces"); Slow flags a duration much slower than that.
	Usual string `json:"usual,omitempty"`
	Slow  bool   `json:"slow,omitempty"`
	// WorstCase is, for a phase not yet over, the longest it can run
	// before it fails for good: every attempt timing out, every backoff
	// at its longest (lifecycle.Phase.WorstCase).
	WorstCase string `json:"worstCase,omitempty"`
}

// usual adds what the step usually takes to c, which took took.
func (c *checkResult) usual(of func(string, bool) (history.Usual, bool), name string, task bool, took time.Duration) {
	if of == nil {
		return
	}
	if u, ok := of(name, task); ok {
		c.Usual, c.Slow = u.String(), u.Slow(took)
	}
}

// estimate adds a rate and a time left to c.
func (c *checkResult) estimate(e lifecycle.Estimate) {
	c.Rate = math.Round(e.Rate*100) / 100
	if e.OK {
		c.ETA = eta.FormatRemaining(e.Remaining)
		c.ETASeconds = math.Round(e.Remaining.Seconds()*100) / 100
	}
}

// ctypeHealthJSON is the media type of /health.
const ctypeHealthJSON = "application/health+json"

// Health-check draft statuses.
const (
	statusPass = "pass"
	statusWarn = "warn"
	statusFail = "fail"
)

// renderHealthJSON renders /health compact, or indented for ?pretty (the
// convention of Consul's API). Compact is the default because checkers read
// it thousands of times for every person who does: indenting makes each
// answer dearer (docs/BENCHMARKS.md, "server/ and health/", the handler
// alone), and Consul keeps only the last 4 KiB of a check's output (which
// is why the verdict is repeated at the end).
func (h *Handler) renderHealthJSON(v view, now time.Time, pretty bool) (int, string, []byte) {
	const ctype = ctypeHealthJSON
	s := v.snap
	b := healthBody{
		Status:      statusFail,
		Version:     h.c.opts.Version,
		ServiceID:   h.c.opts.ServiceID,
		Description: h.c.opts.Description,
		State:       v.state(),
		Since:       s.Since.UTC(),
		Checks:      make(map[string][]checkResult, len(s.Phases)+len(s.Tasks)+len(s.Warnings)),
	}
	code := http.StatusServiceUnavailable
	if v.ready() {
		// A warning is 200 all the same: Nomad and Kubernetes pass it, and
		// Consul would turn a 429, its one warning code, into a warning
		// without telling why; the body's status says it.
		code = http.StatusOK
		b.Status = statusPass
		if s.Degraded || len(s.Warnings) > 0 {
			b.Status = statusWarn
		}
	}
	if b.Status != statusPass {
		b.Output = v.describeWithETA()
	}
	for _, p := range s.Phases {
		c := phaseCheck(p, s.Err != nil, now)
		c.estimate(p.ETA)
		c.usual(h.c.opts.Usual, p.Name, false, p.Duration())
		b.Checks["phase:"+p.Name] = []checkResult{c}
	}
	for _, t := range s.Tasks {
		c := taskCheck(t, now)
		c.estimate(t.ETA)
		c.usual(h.c.opts.Usual, t.Name, true, t.Duration())
		b.Checks["task:"+t.Name] = []checkResult{c}
	}
	for _, w := range s.Warnings {
		c := checkResult{
			ComponentType: "warning",
			Status:        statusWarn,
			Time:          w.Since.UTC(),
			Output:        oneLine(w.Message),
		}
		if t, ok := warningTask(w, s); ok {
			observe(&c, t.Progress)
			c.estimate(t.ETA)
		}
		b.Checks["warning:"+w.Name] = []checkResult{c}
	}
	b.Verdict = verdict{Output: truncate(b.Output, maxVerdictOutput), Status: b.Status}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	if pretty {
		enc.SetIndent("", "  ")
	}
	if err := enc.Encode(b); err != nil {
		return http.StatusServiceUnavailable, "text/plain; charset=utf-8", fmt.Appendf(nil, "health: %v\n", err)
	}
	return code, ctype, buf.Bytes()
}

func phaseCheck(p lifecycle.PhaseSnapshot, lifecycleFailed bool, now time.Time) checkResult {
	c := checkResult{
		ComponentType: "phase",
		Status:        phaseStatus(p.State, lifecycleFailed),
		Time:          readingTime(p.Ended, now),
		State:         string(p.State),
		Attempts:      p.Attempts,
	}
	if d := p.Duration(); d > 0 {
		c.Duration = round(d).String()
	}
	observe(&c, p.Progress)
	if p.State != lifecycle.PhaseSucceeded && p.State != lifecycle.PhasePending {
		c.Output = checkDetail(p)
	}
	if p.WorstCase > 0 && p.Ended.IsZero() {
		c.WorstCase = round(p.WorstCase).String()
	}
	return c
}

func taskCheck(t lifecycle.TaskSnapshot, now time.Time) checkResult {
	c := checkResult{
		ComponentType: "task",
		Status:        statusPass,
		Time:          readingTime(t.Ended, now),
		State:         string(t.State),
	}
	if d := t.Duration(); d > 0 {
		c.Duration = round(d).String()
	}
	observe(&c, t.Progress)
	switch t.State {
	case lifecycle.TaskFailed:
		c.Status = statusWarn // degraded, not down
		if t.Err != nil {
			c.Output = oneLine(t.Err.Error())
		}
	case lifecycle.TaskRunning:
		c.Output = t.Progress.String()
	}
	return c
}

// observe puts progress into the draft's observedValue/observedUnit.
func observe(c *checkResult, p lifecycle.ProgressSnapshot) {
	if p.Done == 0 && p.Total == 0 {
		return
	}
	done := p.Done
	c.ObservedValue = &done
	c.ObservedUnit = p.Unit
	c.ObservedTotal = p.Total
}

// readingTime is when a reading was taken: its end once final, now while it
// still changes.
func readingTime(ended, now time.Time) time.Time {
	if !ended.IsZero() {
		return ended.UTC()
	}
	return now.UTC()
}

// phaseStatus is a phase's draft status. A phase cancelled or skipped
// because the start failed is part of that failure; one cancelled or
// skipped by a drain during the start is only unfinished.
func phaseStatus(s lifecycle.PhaseState, lifecycleFailed bool) string {
	switch s {
	case lifecycle.PhaseSucceeded:
		return statusPass
	case lifecycle.PhaseFailed:
		return statusFail
	case lifecycle.PhaseCancelled, lifecycle.PhaseSkipped:
		if lifecycleFailed {
			return statusFail
		}
	}
	return statusWarn // pending, running, retrying: not done yet
}
