package timeline

import (
	"math"
	"time"

	"github.com/phasegate/phasegate/internal/eta"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/lifecycle/history"
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

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
