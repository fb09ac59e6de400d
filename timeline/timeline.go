package timeline

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/lifecycle/history"
)

// Options adjust the page. The zero value is usable.
type Options struct {
	// Title names the daemon in the page's heading; default "phasegate".
	Title string
	// Refresh is how often the page reloads itself while the lifecycle is
	// created or starting; default 1s. It does not reload once the start
	// is over.
	Refresh time.Duration
	// Links are listed at the bottom of the page, such as the daemon's
	// other endpoints.
	Links []Link
	// Usual, when set, says what a phase (or, with task, a background
	// task) usually takes, from the start history: each bar's text says
	// it, and a step much slower than usual is marked so.
	Usual func(name string, task bool) (history.Usual, bool)
}

// Link is a hyperlink in the page's footer.
type Link struct {
	Text, Href string
}

func (o Options) withDefaults() Options {
	if o.Title == "" {
		o.Title = "phasegate"
	}
	if o.Refresh <= 0 {
		o.Refresh = time.Second
	}
	return o
}

// Handler serves the page for lc's current snapshot, with the rates and
// times left it carries: a page left open shows them for the running
// phases.
func Handler(lc *lifecycle.Lifecycle, opts Options) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		s := lc.Snapshot()
		var buf bytes.Buffer
		if err := Render(&buf, s, lc.Events(0), now, opts); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		// The page is self-contained: no script, no external resource.
		w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
		_, _ = w.Write(buf.Bytes())
	})
}

// Geometry of the chart, in SVG user units (CSS pixels at 100%).
const (
	chartWidth = 1100
	labelWidth = 190 // left column with the names
	rightPad   = 24
	axisHeight = 34
	rowHeight  = 30
	barHeight  = 18
	gapHeight  = 26 // between phases and tasks
	legendH    = 30
)

type page struct {
	Title      string
	Heading    string
	Status     string
	Refresh    int // seconds; 0 for no reload
	Generated  string
	Width      int
	Height     int
	AxisY      int
	ChartLeft  int
	ChartRight int
	Bars       []bar
	Edges      []edge
	Ticks      []tick
	Legend     []legend
	LegendY    int
	NowX       float64
	ShowNow    bool
	TaskSepY   int
	HasTasks   bool
	Links      []Link
	TryColour  string // of failed attempts

	usual func(string, bool) (history.Usual, bool) // Options.Usual
}

// Render writes the page for snapshot s as of now, with the rates and
// times left s carries. events is the lifecycle's event log (its
// Events(0)), from which each attempt of a retried phase is drawn; nil
// draws each phase as one bar.
func Render(w io.Writer, s lifecycle.Snapshot, events []lifecycle.Event, now time.Time, opts Options) error {
	opts = opts.withDefaults()
	p := build(s, attemptsOf(events), now, opts)
	if err := pageTemplate.Execute(w, p); err != nil {
		return fmt.Errorf("timeline: %w", err)
	}
	return nil
}

// build lays out the page for s as of now: its heading, the time axis,
// a row per phase and per task, the dependency arrows and the legend.
func build(s lifecycle.Snapshot, att map[string]attempts, now time.Time, opts Options) page {
	p := newPage(s, now, opts)
	ax := newAxis(s, now)
	p.Ticks = ticks(ax.span, ax.left, ax.right)
	if ax.running && ax.starting {
		p.ShowNow, p.NowX = true, ax.right
	}
	y, index := p.addRows(s, att, now, ax)
	p.addEdges(index)
	p.addLegend(y)
	return p
}

// newPage is the page's frame: titles, status, links, and the reload that
// a page open during the start needs.
func newPage(s lifecycle.Snapshot, now time.Time, opts Options) page {
	p := page{
		Title:      opts.Title + " — startup timeline",
		Width:      chartWidth,
		ChartLeft:  labelWidth,
		ChartRight: chartWidth - rightPad,
		AxisY:      axisHeight,
		Generated:  now.UTC().Format(time.RFC3339),
		Status:     health.DescribeWithETA(s),
		Links:      opts.Links,
		TryColour:  colours[attemptFailed],
		usual:      opts.Usual,
	}
	switch s.State {
	case lifecycle.StateCreated, lifecycle.StateStarting:
		p.Refresh = max(1, int(math.Round(opts.Refresh.Seconds())))
	}
	p.Heading = heading(s, opts.Title, now)
	return p
}

func heading(s lifecycle.Snapshot, title string, now time.Time) string {
	switch s.State {
	case lifecycle.StateServing, lifecycle.StateDraining, lifecycle.StateStopped:
		var last time.Time
		ok := !s.Started.IsZero()
		for _, p := range s.Phases {
			if p.State != lifecycle.PhaseSucceeded {
				ok = false
				break
			}
			if p.Ended.After(last) {
				last = p.Ended
			}
		}
		if ok {
			return fmt.Sprintf("%s %s — started in %s", title, s.State, fmtDuration(last.Sub(s.Started)))
		}
	case lifecycle.StateStarting:
		return fmt.Sprintf("%s starting — %s so far", title, fmtDuration(now.Sub(s.Started)))
	}
	return fmt.Sprintf("%s %s", title, s.State)
}

func join(parts []string, sep string) string {
	var b bytes.Buffer
	for i, p := range parts {
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(p)
	}
	return b.String()
}
