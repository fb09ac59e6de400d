package timeline

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/internal/eta"
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

// Colours by state; the legend lists them.
var colours = map[string]string{
	string(lifecycle.PhasePending):   "#cfd8dc",
	string(lifecycle.PhaseRunning):   "#1e88e5",
	string(lifecycle.PhaseRetrying):  "#fb8c00",
	string(lifecycle.PhaseSucceeded): "#43a047",
	string(lifecycle.PhaseFailed):    "#e53935",
	string(lifecycle.PhaseCancelled): "#8d6e63",
	string(lifecycle.PhaseSkipped):   "#b0bec5",
	attemptFailed:                    "#ef9a9a",
}

var legendOrder = []string{"pending", "running", "retrying", "succeeded", "failed", "cancelled", "skipped", attemptFailed}

// attemptFailed is the legend's name of a retried phase's failed attempt.
const attemptFailed = "failed attempt"

// bar is one row of the chart.
type bar struct {
	Kind    string // "phase" or "task"
	Name    string
	Label   string // left column
	State   string
	Colour  string
	Y       int     // top of the row
	BarY    int     // top of the bar
	X, W    float64 // the bar; W is 0 when it never started
	Done    float64 // width of the finished part of a running bar with a total
	Text    string  // duration, progress, rate, time left
	TextX   float64
	TextEnd bool // anchor the text at its end (left of the bar)
	Inside  bool // the text is drawn on the bar
	Title   string

	// Tries are a retried phase's failed attempts, drawn before its
	// bar, which then covers its last attempt alone.
	Tries []try

	// For the table. Failed sums up the Tries; Usual is what the step
	// usually takes, and Slow marks one much slower than that.
	Duration, Progress, Rate, ETA, Error, Failed, Usual string
	Slow                                                bool
	From                                                string // tasks: the phase that deferred it
	DependsOn                                           []string
}

// usual adds what the step usually takes to its text, title and table
// row, marking it when it took much longer.
func (b *bar) usual(of func(string, bool) (history.Usual, bool), name string, task bool, took time.Duration) {
	if of == nil || b.W == 0 {
		return
	}
	u, ok := of(name, task)
	if !ok {
		return
	}
	b.Usual = u.String()
	b.Text += " · usually " + fmtDuration(u.Median)
	if u.Slow(took) {
		b.Slow = true
		b.Text += " · slower than usual"
	}
	b.Title += " — " + b.Usual
}

// try is one failed attempt of a phase, drawn in the colour of failed
// attempts with its error in its title.
type try struct {
	X, W  float64
	Title string
}

// attempts is what the event log says of one phase's attempts: when each
// began, by number, and those that failed and were retried.
type attempts struct {
	began  map[int]time.Time
	failed []failedAttempt
}

// failedAttempt is an attempt that failed and was retried.
type failedAttempt struct {
	n      int
	ended  time.Time
	errMsg string
}

// attemptsOf reads each phase's attempts from the event log.
func attemptsOf(events []lifecycle.Event) map[string]attempts {
	out := map[string]attempts{}
	for _, e := range events {
		if e.Kind != lifecycle.EventPhase || e.Attempt == 0 {
			continue
		}
		a, ok := out[e.Name]
		if !ok {
			a.began = map[int]time.Time{}
		}
		switch lifecycle.PhaseState(e.To) {
		case lifecycle.PhaseRunning:
			a.began[e.Attempt] = e.Time
		case lifecycle.PhaseRetrying:
			a.failed = append(a.failed, failedAttempt{n: e.Attempt, ended: e.Time, errMsg: e.Err})
		}
		out[e.Name] = a
	}
	return out
}

// drawTries draws the failed attempts of a phase now at attempt last
// before its bar, and narrows the bar to the last attempt. Without the
// event log (att empty) the bar stays whole.
func (b *bar) drawTries(att attempts, last int, ax axis) {
	for _, f := range att.failed {
		began, ok := att.began[f.n]
		if !ok {
			continue
		}
		x := ax.xOf(ax.clip(began))
		b.Tries = append(b.Tries, try{
			X: x, W: math.Max(2, ax.xOf(ax.clip(f.ended))-x),
			Title: fmt.Sprintf("%s: attempt %d failed after %s: %s", b.Label, f.n, fmtDuration(f.ended.Sub(began)), f.errMsg),
		})
	}
	if n := len(att.failed); n > 0 {
		lastErr := att.failed[n-1].errMsg
		b.Failed = fmt.Sprintf("%d failed, the last: %s", n, truncate(lastErr, 120))
	}
	if began, ok := att.began[last]; ok && b.W > 0 {
		end := b.X + b.W
		b.X = ax.xOf(ax.clip(began))
		b.W = math.Max(3, end-b.X)
		b.Done = math.Min(b.Done, b.W)
	}
}

// edge is a dependency arrow from one bar's end to another's start.
type edge struct {
	From, To string
	Path     string
	Task     bool // a phase handing work to a background task
}

type tick struct {
	X     float64
	Label string
}

type legend struct {
	X      int
	State  string
	Colour string
}

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

// axis maps times onto the chart's x coordinates.
type axis struct {
	t0, end     time.Time
	span        time.Duration // end - t0, at least a millisecond
	left, right float64       // the chart's edges
	running     bool          // a phase or task has not ended
	starting    bool          // the lifecycle is created or starting
}

// newAxis spans the chart from the start to now while anything runs, or
// to the last end once everything is over.
func newAxis(s lifecycle.Snapshot, now time.Time) axis {
	a := axis{t0: s.Started, left: float64(labelWidth), right: float64(chartWidth - rightPad)}
	a.end = a.t0
	consider := func(started, ended time.Time) {
		if started.IsZero() {
			return
		}
		if a.t0.IsZero() || started.Before(a.t0) {
			a.t0 = started
		}
		if ended.IsZero() {
			a.running = true
		} else if ended.After(a.end) {
			a.end = ended
		}
	}
	for _, ph := range s.Phases {
		consider(ph.Started, ph.Ended)
	}
	for _, t := range s.Tasks {
		consider(t.Started, t.Ended)
	}
	// While starting, the axis runs to now; after, to the last end, and
	// what still runs (a background loop) reaches the right edge.
	a.starting = s.State == lifecycle.StateStarting || s.State == lifecycle.StateCreated
	if a.starting || !a.end.After(a.t0) {
		a.end = now
	}
	if a.t0.IsZero() {
		a.t0, a.end = now, now
	}
	a.span = max(a.end.Sub(a.t0), time.Millisecond)
	return a
}

// xOf is t's x coordinate.
func (a axis) xOf(t time.Time) float64 {
	return a.left + (a.right-a.left)*float64(t.Sub(a.t0))/float64(a.span)
}

// clip is t, or the axis's end if t is past it.
func (a axis) clip(t time.Time) time.Time {
	if t.After(a.end) {
		return a.end
	}
	return t
}

// addRows adds a bar per phase, then, below a gap, one per task. It
// returns the y below the last row and each bar's place in p.Bars by kind
// and name.
func (p *page) addRows(s lifecycle.Snapshot, att map[string]attempts, now time.Time, ax axis) (int, map[string]int) {
	y := axisHeight + 8
	index := map[string]int{}
	for _, ph := range s.Phases {
		b := bar{
			Kind: "phase", Name: ph.Name, Label: ph.Name, State: string(ph.State),
			Colour: colours[string(ph.State)], Y: y, BarY: y + (rowHeight-barHeight)/2,
			DependsOn: ph.DependsOn,
		}
		// The phase's error is its outcome only when it did not
		// succeed: a retried phase's failed attempts are its Tries.
		var outcome error
		switch ph.State {
		case lifecycle.PhaseFailed, lifecycle.PhaseRetrying, lifecycle.PhaseCancelled:
			outcome = ph.Err
		}
		fill(&b, ph.Started, ph.Ended, ph.Progress, ph.ETA, outcome, now, ax.clip, ax.xOf, ax.right)
		if ph.Attempts > 1 {
			b.Text += fmt.Sprintf(" · attempt %d", ph.Attempts)
			b.drawTries(att[ph.Name], ph.Attempts, ax)
		}
		b.usual(p.usual, ph.Name, false, ph.Duration())
		index["phase\x00"+ph.Name] = len(p.Bars)
		p.Bars = append(p.Bars, b)
		y += rowHeight
	}
	if len(s.Tasks) > 0 {
		p.HasTasks = true
		p.TaskSepY = y + gapHeight/2
		y += gapHeight
	}
	for _, t := range s.Tasks {
		b := bar{
			Kind: "task", Name: t.Name, Label: "task " + t.Name, State: string(t.State), From: t.Phase,
			Colour: colours[string(t.State)], Y: y, BarY: y + (rowHeight-barHeight)/2,
		}
		fill(&b, t.Started, t.Ended, t.Progress, t.ETA, t.Err, now, ax.clip, ax.xOf, ax.right)
		b.usual(p.usual, t.Name, true, t.Duration())
		index["task\x00"+t.Name] = len(p.Bars)
		p.Bars = append(p.Bars, b)
		y += rowHeight
	}
	return y, index
}

// addEdges draws the arrows: from the end of each dependency to the start
// of its dependent, and from a phase's end to the start of each task it
// deferred.
func (p *page) addEdges(index map[string]int) {
	link := func(from, to bar, task bool) {
		if from.W == 0 || to.W == 0 {
			return
		}
		p.Edges = append(p.Edges, edge{From: from.Name, To: to.Name, Path: elbow(from, to), Task: task})
	}
	for _, b := range p.Bars {
		switch b.Kind {
		case "phase":
			for _, d := range b.DependsOn {
				if i, ok := index["phase\x00"+d]; ok {
					link(p.Bars[i], b, false)
				}
			}
		case "task":
			if i, ok := index["phase\x00"+b.From]; ok {
				link(p.Bars[i], b, true)
			}
		}
	}
}

// elbow is the SVG path of an arrow out of the end of from, along its row,
// down (or up) to to's row just before its start, into it. A dependent
// that started right away gets a short detour on the left, so the arrow
// still points into its start.
func elbow(from, to bar) string {
	x1, y1 := from.X+from.W, float64(from.BarY+barHeight/2)
	x2, y2 := to.X, float64(to.BarY+barHeight/2)
	if x2-x1 >= 10 {
		return fmt.Sprintf("M%.1f,%.1f H%.1f V%.1f H%.1f", x1, y1, x2-6, y2, x2-1)
	}
	mid := y2 - float64(rowHeight)/2
	if y2 < y1 {
		mid = y2 + float64(rowHeight)/2
	}
	return fmt.Sprintf("M%.1f,%.1f H%.1f V%.1f H%.1f V%.1f H%.1f", x1, y1, x1+5, mid, x2-7, y2, x2-1)
}

// addLegend lays the colours' legend out below the row ending at y, and
// so fixes the page's height.
func (p *page) addLegend(y int) {
	p.LegendY = y + 14
	x := labelWidth
	for _, st := range legendOrder {
		p.Legend = append(p.Legend, legend{X: x, State: st, Colour: colours[st]})
		x += 22 + 9*len(st) + 18
	}
	p.Height = p.LegendY + legendH
}

// fill places a bar and writes its labels.
func fill(b *bar, started, ended time.Time, prog lifecycle.ProgressSnapshot, e lifecycle.Estimate, err error, now time.Time, clip func(time.Time) time.Time, xOf func(time.Time) float64, right float64) {
	if !started.IsZero() {
		to := ended
		if to.IsZero() {
			to = now
		}
		b.X = xOf(clip(started))
		b.W = math.Max(3, xOf(clip(to))-b.X)
		b.Duration = fmtDuration(to.Sub(started))
		if ended.IsZero() && prog.Total > 0 {
			b.Done = b.W * math.Min(1, float64(prog.Done)/float64(prog.Total))
		}
	}
	b.Progress = prog.String()
	if e.Rate > 0 {
		b.Rate = eta.FormatRate(e.Rate)
	}
	if e.OK {
		b.ETA = "~" + eta.FormatRemaining(e.Remaining)
	}
	if err != nil {
		b.Error = err.Error()
	}
	parts := []string{}
	if b.Duration != "" {
		parts = append(parts, b.Duration)
	} else {
		parts = append(parts, b.State)
	}
	if b.Progress != "" {
		parts = append(parts, b.Progress)
	}
	if b.Rate != "" {
		parts = append(parts, b.Rate)
	}
	if b.ETA != "" {
		parts = append(parts, b.ETA+" left")
	}
	if b.Error != "" && (b.State == string(lifecycle.PhaseFailed) || b.State == string(lifecycle.PhaseRetrying) || b.State == string(lifecycle.TaskFailed)) {
		parts = append(parts, "error: "+truncate(b.Error, 80))
	}
	b.Text = join(parts, " · ")
	b.Title = b.Label + ": " + b.State + " — " + b.Text
	// The label goes right of the bar, or left of it when the bar ends
	// near the right edge.
	end := b.X + b.W
	if b.W == 0 {
		end = float64(labelWidth)
	}
	if end > float64(labelWidth)+(right-float64(labelWidth))*0.62 && b.W > 0 {
		b.TextEnd, b.TextX = true, b.X-6
		if b.X-float64(labelWidth) < 260 { // no room on the left either: inside the bar
			b.TextEnd, b.TextX, b.Inside = true, end-6, true
		}
	} else {
		b.TextX = end + 6
	}
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

// ticks chooses a 1-2-5 step giving about eight ticks over span.
func ticks(span time.Duration, left, right float64) []tick {
	step := time.Duration(1)
	for mag := time.Microsecond; ; mag *= 10 {
		found := false
		for _, m := range []time.Duration{1, 2, 5} {
			if span/(m*mag) <= 8 {
				step, found = m*mag, true
				break
			}
		}
		if found {
			break
		}
	}
	var out []tick
	for t := time.Duration(0); t <= span; t += step {
		out = append(out, tick{X: left + (right-left)*float64(t)/float64(span), Label: fmtTick(t)})
	}
	return out
}

func fmtTick(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Millisecond:
		return strconv.FormatInt(d.Microseconds(), 10) + "µs"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
	}
	return d.String()
}

// fmtDuration keeps durations short: "412µs", "38ms", "2.13s", "3m05s".
func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	case d < time.Minute:
		return d.Round(10 * time.Millisecond).String()
	}
	d = d.Round(time.Second)
	return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
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
