package status

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/eta"
	"github.com/phasegate/phasegate/lifecycle"
)

// liveView draws `status --watch` on a terminal: a frame of one line per
// phase and background task, redrawn in place (cursor up, clear line)
// rather than clearing the screen, so what was above stays and the last
// frame is left behind when the start is over:
//
//	phasegate starting · 2.3s
//	  ✔ lock        2ms
//	  ✔ listen      3ms
//	  ▶ reclaim     ███████████░░░░░░░░░░░░░░  1200/5000 namespaces · 812/s · ~4.7s left
//	  · storage     pending
//	  …
type liveView struct {
	w      io.Writer
	width  int
	lines  int // lines of the last frame
	hidden bool
}

// termWidth is the width of the terminal w writes to, or 80.
func termWidth(w io.Writer) int {
	if f, ok := w.(*os.File); ok {
		if ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col >= 20 {
			return int(ws.Col)
		}
	}
	return 80
}

var stateMarks = map[string]string{
	string(lifecycle.PhasePending):   "·",
	string(lifecycle.PhaseRunning):   "▶",
	string(lifecycle.PhaseRetrying):  "↻",
	string(lifecycle.PhaseSucceeded): "✔",
	string(lifecycle.PhaseFailed):    "✘",
	string(lifecycle.PhaseCancelled): "⊘",
	string(lifecycle.PhaseSkipped):   "-",
}

// ANSI colours by state: running blue, retrying yellow, done green, failed
// red, the rest dim.
var stateColours = map[string]string{
	string(lifecycle.PhaseRunning):   "\x1b[34m",
	string(lifecycle.PhaseRetrying):  "\x1b[33m",
	string(lifecycle.PhaseSucceeded): "\x1b[32m",
	string(lifecycle.PhaseFailed):    "\x1b[31m",
}

func (l *liveView) draw(v View) {
	frame := renderFrame(v, l.width, time.Now())
	var b strings.Builder
	if !l.hidden {
		b.WriteString("\x1b[?25l") // hide the cursor while drawing
		l.hidden = true
	}
	if l.lines > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", l.lines)
	}
	for _, line := range frame {
		b.WriteString("\r\x1b[2K")
		b.WriteString(line)
		b.WriteByte('\n')
	}
	// A shorter frame than the last one: clear what is left below.
	b.WriteString("\x1b[J")
	l.lines = len(frame)
	_, _ = io.WriteString(l.w, b.String())
}

func (l *liveView) close() {
	if l.hidden {
		_, _ = io.WriteString(l.w, "\x1b[?25h")
		l.hidden = false
	}
}

// renderFrame is the live view of v, each line at most width columns.
func renderFrame(v View, width int, now time.Time) []string {
	out := []string{"\x1b[1m" + clip(frameHead(v, now), width) + "\x1b[0m"}
	nameW := 8
	for _, p := range append(append([]PhaseView{}, v.Phases...), v.Tasks...) {
		nameW = max(nameW, utf8.RuneCountInString(p.Name)+5)
	}
	for _, p := range v.Phases {
		out = append(out, frameRow(p, false, nameW, width))
	}
	for _, t := range v.Tasks {
		out = append(out, frameRow(t, true, nameW, width))
	}
	return out
}

// frameHead is the frame's first line: the state, how long the start took
// or has taken so far, and what is wrong.
func frameHead(v View, now time.Time) string {
	head := "phasegate " + string(v.State)
	if !v.Started.IsZero() {
		end := now
		if v.State != lifecycle.StateStarting {
			end = v.Since
		}
		if v.State == lifecycle.StateServing {
			head += " · started in " + end.Sub(v.Started).Round(time.Millisecond).String()
		} else {
			head += " · " + end.Sub(v.Started).Round(100*time.Millisecond).String()
		}
	}
	if v.Degraded {
		head += " (degraded)"
	}
	if v.Error != "" {
		head += ": " + v.Error
	}
	return head
}

// frameRow is the line of a phase, or of a background task, with its name
// in a column nameW wide, at most width columns and coloured by its state.
func frameRow(p PhaseView, task bool, nameW, width int) string {
	name := p.Name
	if task {
		name = "task " + p.Name
	}
	mark := stateMarks[p.State] // task states are phase state names too
	if mark == "" {
		mark = "·"
	}
	prefix := fmt.Sprintf("  %s %-*s ", mark, nameW, name)
	line := clip(prefix+rowDetail(p, width-len([]rune(prefix))), width)
	if c := stateColours[p.State]; c != "" {
		line = c + line + "\x1b[0m"
	}
	return line
}

// rowDetail is what a row says of p after its name: a progress bar while it
// runs with a known total, otherwise how long it took and how far it got.
// room is the width left after the name; the bar takes part of it.
func rowDetail(p PhaseView, room int) string {
	switch {
	case p.State == string(lifecycle.PhaseRunning) && p.Progress.Total > 0:
		barW := min(30, max(10, room-50))
		detail := progressBar(p.Progress.Done, p.Progress.Total, barW) + "  " + p.Progress.String()
		if e := viewEstimate(p); e.String() != "" {
			return detail + " · " + strings.ReplaceAll(e.String(), ", ", " · ")
		}
		return detail + " · " + fmtDuration(p)
	case p.State == string(lifecycle.PhaseRunning):
		detail := fmtDuration(p)
		if prog := p.Progress.String(); prog != "" {
			detail += " · " + prog
		}
		return detail
	case p.State == string(lifecycle.PhasePending):
		return "pending"
	case p.Started.IsZero():
		return p.State
	}
	return finishedDetail(p)
}

// finishedDetail is the detail of a phase or task that ended: how long it
// took, its state unless it succeeded, how far it got, its rate and its
// error.
func finishedDetail(p PhaseView) string {
	detail := fmtDuration(p)
	if p.State != string(lifecycle.PhaseSucceeded) {
		detail = p.State + " after " + detail
	}
	if prog := p.Progress.String(); prog != "" {
		detail += " · " + prog
	}
	if p.Rate > 0 && p.Progress.Done > 1 {
		detail += " · " + eta.FormatRate(p.Rate)
	}
	if p.Error != "" && p.State != string(lifecycle.PhaseSucceeded) {
		detail += " · " + p.Error
	}
	return detail
}

// progressBar draws done/total in w cells.
func progressBar(done, total int64, w int) string {
	if total <= 0 {
		return strings.Repeat("░", w)
	}
	f := min(w, int(float64(w)*float64(done)/float64(total)))
	return strings.Repeat("█", f) + strings.Repeat("░", w-f)
}

// clip cuts s to width runes.
func clip(s string, width int) string {
	if utf8.RuneCountInString(s) <= width {
		return s
	}
	r := []rune(s)
	return string(r[:max(1, width-1)]) + "…"
}
