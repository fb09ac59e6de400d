package timeline

import (
	"fmt"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// edge is a dependency arrow from one bar's end to another's start.
type edge struct {
	From, To string
	Path     string
	Task     bool // a phase handing work to a background task
}

// legend is one entry of the legend: a state and its colour.
type legend struct {
	X      int
	State  string
	Colour string
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
