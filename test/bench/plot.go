package main

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Colors of the strategies and markers.
var (
	colorPhasegate = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	colorGRPC      = color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff}
	colorSerial    = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	colorFloor     = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	colorServing   = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
	colorBar       = color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}
)

// minLogMs is the floor of the log-scale axes (a zero cannot be drawn).
const minLogMs = 0.1

// writePlots writes answer.png, serving.png, timeline.png and, when the
// serial baseline ran, timeline-serial.png into dir.
func writePlots(res *Results, dir string) error {
	answer, err := versusN(res, "Time to first health answer", []seriesSpec{
		{"phasegate: first HTTP answer", stratPhasegate, func(p *Point) Summary { return p.FirstAnswerMs }, nil, colorPhasegate},
		{"phasegate: first gRPC answer", stratPhasegate, func(p *Point) Summary { return p.FirstGRPCMs }, nil, colorGRPC},
		{"serial baseline: port answers", stratSerial, func(p *Point) Summary { return p.FirstAnswerMs },
			func(e *Extrapolation) float64 { return e.FirstAnswerMs }, colorSerial},
	})
	if err != nil {
		return err
	}
	if err := answer.Save(16*vg.Centimeter, 11*vg.Centimeter, filepath.Join(dir, "answer.png")); err != nil {
		return err
	}
	serving, err := versusN(res, "Time to SERVING", []seriesSpec{
		{"phasegate", stratPhasegate, func(p *Point) Summary { return p.ServingMs }, nil, colorPhasegate},
		{"kernel floor (no daemon)", stratFloor, func(p *Point) Summary { return p.ServingMs }, nil, colorFloor},
		{"serial baseline", stratSerial, func(p *Point) Summary { return p.ServingMs },
			func(e *Extrapolation) float64 { return e.ServingMs }, colorSerial},
	})
	if err != nil {
		return err
	}
	if err := serving.Save(16*vg.Centimeter, 11*vg.Centimeter, filepath.Join(dir, "serving.png")); err != nil {
		return err
	}
	if err := saveTimeline(res, stratPhasegate, filepath.Join(dir, "timeline.png")); err != nil {
		return err
	}
	if hasSerialTimeline(res) {
		return saveTimeline(res, stratSerial, filepath.Join(dir, "timeline-serial.png"))
	}
	return nil
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
// median with min–max bars.
func versusN(res *Results, title string, specs []seriesSpec) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s (median, min–max bars) — %d CPUs, load avg %.1f–%.1f",
		title, res.Machine.NumCPU, res.Machine.LoadMin, res.Machine.LoadMax)
	p.X.Label.Text = "leaked slots N"
	p.Y.Label.Text = "ms from exec (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	for _, s := range specs {
		if err := addSeries(p, res, s); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// addSeries adds a measured line with error bars and, if any, a dashed
// extrapolated line.
func addSeries(p *plot.Plot, res *Results, s seriesSpec) error {
	var pts errorPoints
	var est plotter.XYs
	for _, n := range res.Settings.Ns {
		pt := res.find(s.strategy, n)
		switch {
		case pt.measured():
			v := s.value(pt)
			if v.Median <= 0 {
				continue // N=0 of the floor: nothing to draw on a log axis
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
			return err
		}
		line.Color, scatter.Color = s.color, s.color
		line.Width = vg.Points(1.5)
		bars, err := plotter.NewYErrorBars(pts)
		if err != nil {
			return err
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
			return err
		}
		line.Color, line.Dashes = s.color, []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(line)
		p.Legend.Add(s.label+" — extrapolated, not measured", line)
	}
	return nil
}

// timelineRun picks the run whose phases the timeline shows: at the largest
// N the strategy measured, the run with the median time to SERVING.
func timelineRun(res *Results, strategy string) (*Point, *Run) {
	for _, n := range slices.Backward(res.Settings.Ns) {
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

func hasSerialTimeline(res *Results) bool {
	p, _ := timelineRun(res, stratSerial)
	return p != nil
}

// saveTimeline draws one bar per phase of one start, with markers at the
// first answer and at SERVING.
func saveTimeline(res *Results, strategy, file string) error {
	pt, run := timelineRun(res, strategy)
	p := plot.New()
	if pt == nil {
		p.Title.Text = "startup timeline: no run"
		return p.Save(16*vg.Centimeter, 8*vg.Centimeter, file)
	}
	name := map[string]string{stratPhasegate: "phasegate", stratSerial: "serial baseline (--serial-baseline)"}[strategy]
	p.Title.Text = fmt.Sprintf("%s startup with %d leaked slots (the median run)", name, pt.N)
	end := math.Max(run.ServingMs, lastEnd(run.Phases))
	unit, div := "ms", 1.0
	if end >= 10_000 {
		unit, div = "s", 1000
	}
	p.X.Label.Text = unit + " from exec"
	spans := make([]PhaseSpan, len(run.Phases))
	for i, s := range run.Phases {
		s.StartMs, s.EndMs = s.StartMs/div, s.EndMs/div
		spans[len(spans)-1-i] = s // the first phase at the top
	}
	names := make([]string, len(spans))
	for i, s := range spans {
		names[i] = s.Name
	}
	p.Add(plotter.NewGrid())
	p.Add(&gantt{spans: spans, color: colorBar})
	top := float64(len(spans)) - 0.5
	for _, m := range []struct {
		label string
		x     float64
		color color.Color
	}{
		{"first HTTP answer " + fmtMs(run.FirstAnswerMs), run.FirstAnswerMs / div, colorPhasegate},
		{"SERVING " + fmtMs(run.ServingMs), run.ServingMs / div, colorServing},
	} {
		line, err := plotter.NewLine(plotter.XYs{{X: m.x, Y: -0.5}, {X: m.x, Y: top}})
		if err != nil {
			return err
		}
		line.Color, line.Width, line.Dashes = m.color, vg.Points(1.5), []vg.Length{vg.Points(4), vg.Points(2)}
		p.Add(line)
		p.Legend.Add(m.label, line)
	}
	p.Legend.Top = true
	p.NominalY(names...)
	p.Y.Max = top + 1.2 // room for the legend above the first phase
	p.X.Min = 0
	p.X.Max = 1.05 * end / div
	return p.Save(16*vg.Centimeter, 9*vg.Centimeter, file)
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
// span's index on the y axis.
type gantt struct {
	spans []PhaseSpan
	color color.Color
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
		c.FillPolygon(g.color, c.ClipPolygonXY(box))
	}
}

// DataRange implements plot.DataRanger.
func (g *gantt) DataRange() (xmin, xmax, ymin, ymax float64) {
	for _, s := range g.spans {
		xmax = math.Max(xmax, math.Max(s.EndMs, s.StartMs))
	}
	return 0, xmax, -0.5, float64(len(g.spans)) - 0.5
}
