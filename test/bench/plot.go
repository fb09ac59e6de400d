package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Colors of the series.
var (
	colorBackground = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	colorForeground = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	colorSerial     = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	colorFloor      = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	colorTerm       = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
	colorKill       = color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff}
	colorAfter      = color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff}
	colorGoal       = color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}
	colorBar        = color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}
	colorTask       = color.RGBA{R: 0xbc, G: 0xbd, B: 0x22, A: 0xff}
	colorFailed     = color.RGBA{A: 0xff}
)

// minLogMs is the floor of the log-scale axes (a zero cannot be drawn).
const minLogMs = 0.1

// Plot sizes.
const (
	plotW = 16 * vg.Centimeter
	plotH = 11 * vg.Centimeter
)

// writePlots writes the PNGs of the parts the results have into dir, and
// removes those of parts they have not, so that no stale figure stays
// beside the report.
func writePlots(res *Results, dir string) error {
	type figure struct {
		file string
		has  bool
		make func() (*plot.Plot, error)
	}
	dead, restore := len(res.ns(deadStrategies)) > 0, len(res.ns(restoreStrategies)) > 0
	figs := []figure{
		{"serving.png", dead || restore, func() (*plot.Plot, error) { return servingPlot(res) }},
		{"reclaim.png", dead, func() (*plot.Plot, error) { return reclaimPlot(res) }},
		{"timeline.png", hasTimeline(res, stratBackground), func() (*plot.Plot, error) { return timelinePlot(res, stratBackground) }},
		{"timeline-serial.png", hasTimeline(res, stratSerial), func() (*plot.Plot, error) { return timelinePlot(res, stratSerial) }},
		{"latency.png", res.Load != nil, func() (*plot.Plot, error) { return latencyPlot(res.Load) }},
		{"latency-series.png", res.Load != nil && len(res.Load.Runs) > 0, func() (*plot.Plot, error) { return latencySeriesPlot(res.Load) }},
		{"acquire.png", res.Acquire != nil, func() (*plot.Plot, error) { return acquirePlot(res.Acquire) }},
	}
	for _, f := range figs {
		path := filepath.Join(dir, f.file)
		if !f.has {
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				return err
			}
			continue
		}
		p, err := f.make()
		if err != nil {
			return fmt.Errorf("%s: %w", f.file, err)
		}
		h := plotH
		if f.file == "timeline.png" || f.file == "timeline-serial.png" {
			h = 10 * vg.Centimeter
		}
		if err := p.Save(plotW, h, path); err != nil {
			return fmt.Errorf("%s: %w", f.file, err)
		}
	}
	path := filepath.Join(dir, "upgrade.png")
	if res.Upgrade == nil || len(res.Upgrade.Scenarios) == 0 {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return err
		}
		return nil
	}
	return saveUpgradePlot(res.Upgrade, path)
}

// seriesSpec is one line of a versus-N plot.
type seriesSpec struct {
	label    string
	strategy string
	value    func(*Point) Summary
	// extrapolated, if set, draws skipped points' estimates as a dashed line.
	extrapolated func(*Extrapolation) float64
	color        color.Color
}

// errorPoints are points with min–max error bars.
type errorPoints struct {
	plotter.XYs
	plotter.YErrors
}

// versusN plots each series against N on a log-scale time axis, the
// median with min–max bars, and dashed reference lines.
func versusN(res *Results, title, xLabel string, specs []seriesSpec, refs []reference) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = "ms (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	drawn := 0
	for _, s := range specs {
		n, err := addSeries(p, res, s)
		if err != nil {
			return nil, err
		}
		drawn += n
	}
	if drawn == 0 {
		p.Y.Scale, p.Y.Tick.Marker = plot.LinearScale{}, plot.DefaultTicks{}
		p.Title.Text += ": nothing measured"
		return p, nil
	}
	for _, ref := range refs {
		if err := addReference(p, ref); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// reference is a dashed line: a goal, a multiple of a baseline, a moment.
type reference struct {
	label string
	xys   plotter.XYs
	color color.Color // gray when nil
}

func addReference(p *plot.Plot, ref reference) error {
	if len(ref.xys) < 2 {
		return nil
	}
	line, err := plotter.NewLine(ref.xys)
	if err != nil {
		return err
	}
	line.Color, line.Dashes = colorGoal, []vg.Length{vg.Points(2), vg.Points(2)}
	if ref.color != nil {
		line.Color, line.Width = ref.color, vg.Points(1.5)
	}
	p.Add(line)
	p.Legend.Add(ref.label, line)
	return nil
}

// addSeries adds a measured line with error bars and, if any, a dashed
// extrapolated line; it returns how many points it drew.
func addSeries(p *plot.Plot, res *Results, s seriesSpec) (int, error) {
	var pts errorPoints
	var est plotter.XYs
	for _, n := range res.ns([]string{s.strategy}) {
		pt := res.find(s.strategy, n)
		switch {
		case pt.measured():
			v := s.value(pt)
			if v.Median <= 0 {
				continue // nothing to draw on a log axis
			}
			y := max(v.Median, minLogMs)
			pts.XYs = append(pts.XYs, plotter.XY{X: float64(n), Y: y})
			pts.YErrors = append(pts.YErrors, struct{ Low, High float64 }{
				Low: y - max(v.Min, minLogMs), High: max(v.Max, minLogMs) - y})
		case pt != nil && pt.Extrapolated != nil && s.extrapolated != nil:
			est = append(est, plotter.XY{X: float64(n), Y: max(s.extrapolated(pt.Extrapolated), minLogMs)})
		}
	}
	if len(pts.XYs) > 0 {
		line, scatter, err := plotter.NewLinePoints(pts.XYs)
		if err != nil {
			return 0, err
		}
		line.Color, scatter.Color = s.color, s.color
		line.Width = vg.Points(1.5)
		bars, err := plotter.NewYErrorBars(pts)
		if err != nil {
			return 0, err
		}
		bars.Color = s.color
		p.Add(line, scatter, bars)
		p.Legend.Add(s.label, line, scatter)
		if len(est) > 0 {
			est = append(plotter.XYs{pts.XYs[len(pts.XYs)-1]}, est...)
		}
	}
	if len(est) > 1 {
		line, err := plotter.NewLine(est)
		if err != nil {
			return 0, err
		}
		line.Color, line.Dashes = s.color, []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(line)
		p.Legend.Add(s.label+" — extrapolated, not measured", line)
	}
	return len(pts.XYs), nil
}

func servingPlot(res *Results) (*plot.Plot, error) {
	serving := func(p *Point) Summary { return p.ServingMs }
	var ns []int
	for _, n := range res.ns(append(slices.Clone(deadStrategies), restoreStrategies...)) {
		ns = append(ns, n)
	}
	var goal plotter.XYs
	if len(ns) > 1 {
		goal = plotter.XYs{{X: float64(ns[0]), Y: goalServingMs}, {X: float64(ns[len(ns)-1]), Y: goalServingMs}}
	}
	p, err := versusN(res, "exec → SERVING after a restart (median, min–max bars)", "slots on the host N (dead, or leased)", []seriesSpec{
		{"N dead, background reclaim (default)", stratBackground, serving, nil, colorBackground},
		{"N leased, SIGTERM + start", stratRestoreTerm, serving, nil, colorTerm},
		{"N leased, kill -9 + start", stratRestoreKill, serving, nil, colorKill},
		{"N dead, --reclaim=foreground (before live restore)", stratForeground, serving, nil, colorForeground},
		{"N dead, serial baseline", stratSerial, serving, func(e *Extrapolation) float64 { return e.ServingMs }, colorSerial},
		{"kernel floor: removing N (no daemon)", stratFloor, serving, nil, colorFloor},
	}, []reference{{fmt.Sprintf("goal: %.0f ms", goalServingMs), goal, nil}})
	if err == nil {
		roomBelow(p)
	}
	return p, err
}

// roomBelow moves a log-scale plot's legend to the bottom right and
// extends the axis down to 1 ms, where no series of these plots goes, so
// that the legend covers none.
func roomBelow(p *plot.Plot) {
	if _, ok := p.Y.Scale.(plot.LogScale); !ok {
		return
	}
	p.Legend.Top, p.Legend.Left = false, false
	p.Y.Min = 1
}

func reclaimPlot(res *Results) (*plot.Plot, error) {
	var twice plotter.XYs
	for _, n := range res.ns([]string{stratFloor}) {
		if p := res.find(stratFloor, n); p.measured() && n > 0 {
			twice = append(twice, plotter.XY{X: float64(n), Y: goalGoneVsFloor * p.ServingMs.Median})
		}
	}
	p, err := versusN(res, "dead slots all gone (median, min–max bars)", "dead slots N", []seriesSpec{
		{"background: from exec", stratBackground, func(p *Point) Summary { return p.DeadGoneMs }, nil, colorBackground},
		{"background: from SERVING", stratBackground, func(p *Point) Summary { return p.AfterServingMs }, nil, colorAfter},
		{"foreground: from exec (before SERVING)", stratForeground, func(p *Point) Summary { return p.DeadGoneMs }, nil, colorForeground},
		{"kernel floor", stratFloor, func(p *Point) Summary { return p.ServingMs }, nil, colorFloor},
	}, []reference{{fmt.Sprintf("goal: %.0f× the floor, from SERVING", goalGoneVsFloor), twice, nil}})
	if err == nil {
		roomBelow(p)
	}
	return p, err
}

// timelineRun picks the run whose phases the timeline shows: at the largest
// N the strategy measured, the run with the median time to SERVING.
func timelineRun(res *Results, strategy string) (*Point, *Run) {
	for _, n := range slices.Backward(res.ns([]string{strategy})) {
		p := res.find(strategy, n)
		if !p.measured() {
			continue
		}
		var best *Run
		for i := range p.Runs {
			r := &p.Runs[i]
			if len(r.Phases) == 0 {
				continue
			}
			if best == nil || math.Abs(r.ServingMs-p.ServingMs.Median) < math.Abs(best.ServingMs-p.ServingMs.Median) {
				best = r
			}
		}
		if best != nil {
			return p, best
		}
	}
	return nil, nil
}

func hasTimeline(res *Results, strategy string) bool {
	p, _ := timelineRun(res, strategy)
	return p != nil
}

// timelinePlot draws one bar per phase and background task of one start,
// with markers at the first answer, at SERVING and, for the background
// reclaim, when the dead were all gone.
func timelinePlot(res *Results, strategy string) (*plot.Plot, error) {
	pt, run := timelineRun(res, strategy)
	p := plot.New()
	name := map[string]string{stratBackground: "phasegate (background reclaim)", stratSerial: "serial baseline (E2B's orchestrator)"}[strategy]
	p.Title.Text = fmt.Sprintf("%s start with %d dead slots (the median run)", name, pt.N)
	end := math.Max(math.Max(run.ServingMs, run.DeadGoneMs), lastEnd(run.Phases))
	unit, div := "ms", 1.0
	if end >= 10_000 {
		unit, div = "s", 1000
	}
	p.X.Label.Text = unit + " from exec"
	spans := make([]PhaseSpan, len(run.Phases))
	for i, s := range run.Phases {
		if s.Task && s.State == "running" && s.EndMs == 0 {
			s.EndMs, s.Name = end, s.Name+" (runs on)"
		}
		s.StartMs, s.EndMs = s.StartMs/div, s.EndMs/div
		if s.Task {
			s.Name = "task: " + s.Name
		}
		spans[len(spans)-1-i] = s // the first phase at the top
	}
	names := make([]string, len(spans))
	for i, s := range spans {
		names[i] = s.Name
	}
	p.Add(plotter.NewGrid())
	p.Add(&gantt{spans: spans})
	top := float64(len(spans)) - 0.5
	marks := []struct {
		label string
		x     float64
		color color.Color
	}{
		{"first HTTP answer " + fmtMs(run.FirstAnswerMs), run.FirstAnswerMs / div, colorBackground},
		{"SERVING " + fmtMs(run.ServingMs), run.ServingMs / div, colorTerm},
	}
	if run.DeadGoneMs > 0 {
		marks = append(marks, struct {
			label string
			x     float64
			color color.Color
		}{"dead all gone " + fmtMs(run.DeadGoneMs), run.DeadGoneMs / div, colorFloor})
	}
	for _, m := range marks {
		line, err := plotter.NewLine(plotter.XYs{{X: m.x, Y: -0.5}, {X: m.x, Y: top}})
		if err != nil {
			return nil, err
		}
		line.Color, line.Width, line.Dashes = m.color, vg.Points(1.5), []vg.Length{vg.Points(4), vg.Points(2)}
		p.Add(line)
		p.Legend.Add(m.label, line)
	}
	p.Legend.Top = true
	p.NominalY(names...)
	p.Y.Max = top + 1.6 // room for the legend above the first phase
	p.X.Min = 0
	p.X.Max = 1.05 * end / div
	return p, nil
}

// lastEnd returns the latest end of the spans.
func lastEnd(spans []PhaseSpan) float64 {
	var end float64
	for _, s := range spans {
		end = math.Max(end, s.EndMs)
	}
	return end
}

// gantt draws horizontal bars from each span's start to its end, at the
// span's index on the y axis; background tasks in their own color.
type gantt struct {
	spans []PhaseSpan
}

// Plot implements plot.Plotter.
func (g *gantt) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	half := vg.Points(6)
	for i, s := range g.spans {
		y := trY(float64(i))
		x0, x1 := trX(s.StartMs), trX(math.Max(s.EndMs, s.StartMs))
		if x1-x0 < vg.Points(1.5) {
			x1 = x0 + vg.Points(1.5) // a sub-millisecond phase stays visible
		}
		box := []vg.Point{{X: x0, Y: y - half}, {X: x1, Y: y - half}, {X: x1, Y: y + half}, {X: x0, Y: y + half}}
		col := color.Color(colorBar)
		if s.Task {
			col = colorTask
		}
		c.FillPolygon(col, c.ClipPolygonXY(box))
	}
}

// DataRange implements plot.DataRanger.
func (g *gantt) DataRange() (xmin, xmax, ymin, ymax float64) {
	for _, s := range g.spans {
		xmax = math.Max(xmax, math.Max(s.EndMs, s.StartMs))
	}
	return 0, xmax, -0.5, float64(len(g.spans)) - 0.5
}
