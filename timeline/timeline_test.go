package timeline_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/timeline"
)

// startSnapshot is a start in the middle of its reclaim: lock and listen
// done, reclaim at 1200/5000, the rest pending.
func startSnapshot(t0 time.Time) lifecycle.Snapshot {
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	return lifecycle.Snapshot{
		State: lifecycle.StateStarting, Since: t0, Started: t0,
		Phases: []lifecycle.PhaseSnapshot{
			{Name: "lock", State: lifecycle.PhaseSucceeded, Attempts: 1, Started: at(0), Ended: at(2)},
			{Name: "listen", DependsOn: []string{"lock"}, State: lifecycle.PhaseSucceeded, Attempts: 1, Started: at(2), Ended: at(5)},
			{Name: "reclaim", DependsOn: []string{"lock"}, State: lifecycle.PhaseRunning, Attempts: 1, Started: at(2),
				Progress: lifecycle.ProgressSnapshot{Done: 1200, Total: 5000, Unit: "namespaces"}},
			{Name: "storage", DependsOn: []string{"reclaim"}, State: lifecycle.PhasePending},
			{Name: "populate", DependsOn: []string{"storage"}, State: lifecycle.PhasePending},
			{Name: "register", DependsOn: []string{"listen", "populate"}, State: lifecycle.PhasePending},
			{Name: "serve", DependsOn: []string{"register"}, State: lifecycle.PhasePending},
		},
	}
}

// servedSnapshot is the same start once serving, with two background tasks.
func servedSnapshot(t0 time.Time) lifecycle.Snapshot {
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	s := startSnapshot(t0)
	s.State, s.Since = lifecycle.StateServing, at(2400)
	ends := map[string][2]int{"reclaim": {2, 2100}, "storage": {2100, 2110}, "populate": {2110, 2390}, "register": {2390, 2395}, "serve": {2395, 2400}}
	for i := range s.Phases {
		p := &s.Phases[i]
		if e, ok := ends[p.Name]; ok {
			p.State, p.Attempts, p.Started, p.Ended = lifecycle.PhaseSucceeded, 1, at(e[0]), at(e[1])
		}
	}
	s.Phases[2].Progress.Done = 5000
	s.Tasks = []lifecycle.TaskSnapshot{
		{Name: "reconcile", Phase: "storage", State: lifecycle.TaskRunning, Started: at(2110)},
		{Name: "fill", Phase: "populate", State: lifecycle.TaskSucceeded, Started: at(2390), Ended: at(3000),
			Progress: lifecycle.ProgressSnapshot{Done: 16, Total: 16, Unit: "warm slots"}},
	}
	return s
}

// svgDoc is the part of the chart the tests read.
type svgDoc struct {
	Groups []struct {
		Class string `xml:"class,attr"`
		Name  string `xml:"data-name,attr"`
		State string `xml:"data-state,attr"`
		Rects []struct {
			Class string `xml:"class,attr"`
			Fill  string `xml:"fill,attr"`
			Width string `xml:"width,attr"`
		} `xml:"rect"`
		Texts []struct {
			Class string `xml:"class,attr"`
			Text  string `xml:",chardata"`
		} `xml:"text"`
		Paths []struct {
			Class string `xml:"class,attr"`
			From  string `xml:"data-from,attr"`
			To    string `xml:"data-to,attr"`
		} `xml:"path"`
	} `xml:"g"`
}

// render renders s and parses its SVG, which must be well-formed XML.
func render(t *testing.T, s lifecycle.Snapshot, now time.Time) (string, svgDoc) {
	t.Helper()
	var buf bytes.Buffer
	if err := timeline.Render(&buf, s, nil, now, timeline.Options{Links: []timeline.Link{{Text: "/health", Href: "/health"}}}); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	start, end := strings.Index(page, "<svg"), strings.Index(page, "</svg>")
	if start < 0 || end < 0 {
		t.Fatalf("no svg in the page:\n%s", page)
	}
	var doc svgDoc
	if err := xml.Unmarshal([]byte(page[start:end+len("</svg>")]), &doc); err != nil {
		t.Fatalf("svg is not well-formed: %v\n%s", err, page[start:end])
	}
	return page, doc
}

func bars(doc svgDoc, kind string) map[string]string {
	out := map[string]string{}
	for _, g := range doc.Groups {
		if g.Class == "bar "+kind {
			out[g.Name] = g.State
		}
	}
	return out
}

func TestRenderWhileStarting(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := startSnapshot(t0)
	s.Phases[2].Progress.Done = 1600
	s.Phases[2].ETA = lifecycle.Estimate{Rate: 400, Remaining: 8500 * time.Millisecond, OK: true} // 3400 left
	page, doc := render(t, s, t0.Add(2500*time.Millisecond))

	got := bars(doc, "phase")
	want := map[string]string{"lock": "succeeded", "listen": "succeeded", "reclaim": "running",
		"storage": "pending", "populate": "pending", "register": "pending", "serve": "pending"}
	if len(got) != len(want) {
		t.Fatalf("bars %v, want one per phase %v", got, want)
	}
	for n, st := range want {
		if got[n] != st {
			t.Errorf("bar %s state %q, want %q", n, got[n], st)
		}
	}
	for _, needle := range []string{
		`<meta http-equiv="refresh" content="1">`,
		"1600/5000 namespaces · 400/s · ~8.5s left",
		"starting: phase reclaim 1600/5000 namespaces (400/s, ~8.5s left)",
		`<a href="/health">/health</a>`,
	} {
		if !strings.Contains(page, needle) {
			t.Errorf("page lacks %q", needle)
		}
	}
	if strings.Contains(page, "<script") {
		t.Error("the page has a script")
	}
	edges := 0
	for _, g := range doc.Groups {
		if g.Class == "edges" {
			for _, p := range g.Paths {
				edges++
				if p.From == "" || p.To == "" {
					t.Errorf("edge without ends: %+v", p)
				}
			}
		}
	}
	if edges != 2 { // lock→listen, lock→reclaim: the others' phases have not started
		t.Errorf("%d edges, want 2", edges)
	}
}

func TestRenderWhenServing(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	page, doc := render(t, servedSnapshot(t0), t0.Add(5*time.Second))
	if strings.Contains(page, `http-equiv="refresh"`) {
		t.Error("a served start still refreshes")
	}
	if !strings.Contains(page, "phasegate serving — started in 2.4s") {
		t.Errorf("heading lacks the startup duration:\n%.600s", page)
	}
	if got := bars(doc, "phase"); len(got) != 7 {
		t.Errorf("phase bars %v", got)
	}
	if got := bars(doc, "task"); got["reconcile"] != "running" || got["fill"] != "succeeded" {
		t.Errorf("task bars %v", got)
	}
	var edges, taskEdges int
	for _, g := range doc.Groups {
		for _, p := range g.Paths {
			if strings.HasPrefix(p.Class, "edge") {
				edges++
				if p.Class == "edge task" {
					taskEdges++
				}
			}
		}
	}
	if edges != 7+2 || taskEdges != 2 { // 7 dependency pairs, 2 hand-offs
		t.Errorf("%d edges (%d to tasks), want 9 (2)", edges, taskEdges)
	}
	for _, g := range doc.Groups {
		if g.Class == "bar phase" && g.Name == "reclaim" {
			if len(g.Rects) == 0 || g.Rects[0].Fill != "#43a047" {
				t.Errorf("reclaim bar %+v, want a green bar", g.Rects)
			}
		}
	}
}

// Names and errors are escaped, whatever they hold.
func TestRenderEscapes(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := startSnapshot(t0)
	s.State = lifecycle.StateFailed
	s.Err = errors.New(`<script>alert(1)</script>`)
	s.Phases[2].State = lifecycle.PhaseFailed
	s.Phases[2].Ended = t0.Add(time.Second)
	s.Phases[2].Err = errors.New(`"><img src=x onerror=alert(1)>`)
	page, _ := render(t, s, t0.Add(time.Second))
	if strings.Contains(page, "<script>alert") || strings.Contains(page, "<img src=x") {
		t.Errorf("unescaped input in the page:\n%s", page)
	}
}

func nop(context.Context, *lifecycle.Progress) error { return nil }

func TestHandlerServesThePage(t *testing.T) {
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "only", Run: nop}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(timeline.Handler(lc, timeline.Options{Title: "demo"}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("%d %v", resp.StatusCode, resp.Header)
	}
}

// A phase that failed 3 attempts and then succeeded is drawn as 3 failed
// attempts, each in the failed attempts' colour with its error, and a
// green bar for the fourth; its table row keeps the errors to the failed
// attempts' column and shows no error as the phase's outcome.
func TestRenderDrawsEachAttempt(t *testing.T) {
	var n int
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "registry",
		Retry: lifecycle.RetryPolicy{Attempts: 5, Backoff: 5 * time.Millisecond, Multiplier: 1},
		Run: func(context.Context, *lifecycle.Progress) error {
			if n++; n <= 3 {
				time.Sleep(2 * time.Millisecond)
				return errors.New("dial tcp 127.0.0.1:5000: connection refused")
			}
			return nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer lc.Drain(context.Background())
	var buf bytes.Buffer
	if err := timeline.Render(&buf, lc.Snapshot(), lc.Events(0), time.Now(), timeline.Options{}); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	var doc svgDoc
	start, end := strings.Index(page, "<svg"), strings.Index(page, "</svg>")
	if err := xml.Unmarshal([]byte(page[start:end+len("</svg>")]), &doc); err != nil {
		t.Fatal(err)
	}
	var tries, barFill string
	count := 0
	for _, g := range doc.Groups {
		if g.Name != "registry" {
			continue
		}
		for _, r := range g.Rects {
			switch r.Class {
			case "try":
				count++
				tries = r.Fill
			case "bar":
				barFill = r.Fill
			}
		}
	}
	if count != 3 || tries != "#ef9a9a" || barFill != "#43a047" {
		t.Errorf("registry drawn with %d failed attempts (fill %q) and a bar of %q, want 3 in #ef9a9a and a green bar", count, tries, barFill)
	}
	for _, needle := range []string{"registry: attempt 1 failed after", "attempt 3 failed after", "3 failed, the last: dial tcp 127.0.0.1:5000: connection refused"} {
		if !strings.Contains(page, needle) {
			t.Errorf("page lacks %q", needle)
		}
	}
	row := page[strings.Index(page, `<tr class="phase" data-name="registry">`):]
	row = row[:strings.Index(row, "</tr>")]
	if !strings.HasSuffix(row, "<td></td>") {
		t.Errorf("the succeeded phase's row shows an error as its outcome: %s", row)
	}
}
