package main

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// latencyPlot shows p50 and p99 of each request kind during the
// background reclaim and idle.
func latencyPlot(l *LoadResult) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("latency during the background reclaim of %d dead, beside a control server, vs idle", l.N)
	p.Y.Label.Text = "ms (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	var names []string
	for _, k := range []string{kindGRPC, kindHTTP, kindAcquire} {
		if _, ok := l.Idle[k]; ok {
			names = append(names, k+" p50", k+" p99", k+" max")
		}
	}
	windows := []struct {
		label string
		m     map[string]LatencyStats
		color color.Color
	}{{"during the reclaim", l.Reclaim, colorForeground}, {"control server, same time", l.Control, colorFloor},
		{"after a start, nothing to reclaim", l.Start, colorTerm}, {"idle", l.Idle, colorBackground}}
	for i, c := range windows {
		var xys plotter.XYs
		for j, name := range names {
			st, ok := c.m[name[:len(name)-4]]
			if !ok {
				continue // the control server takes no Acquire
			}
			v := map[string]float64{"p50": st.P50Ms, "p99": st.P99Ms, "max": st.MaxMs}[name[len(name)-3:]]
			xys = append(xys, plotter.XY{X: float64(j) + 0.15*float64(i) - 0.225, Y: max(v, minLogMs)})
		}
		sc, err := plotter.NewScatter(xys)
		if err != nil {
			return nil, err
		}
		sc.Color, sc.Radius = c.color, vg.Points(4)
		sc.Shape = draw.CircleGlyph{}
		p.Add(sc)
		p.Legend.Add(c.label, sc)
	}
	var goals []reference
	if _, ok := l.Idle[kindAcquire]; ok {
		goals = append(goals, reference{fmt.Sprintf("goal: Acquire p99 %.0f ms", goalAcquireLoadP99Ms),
			plotter.XYs{{X: float64(len(names)) - 3.5, Y: goalAcquireLoadP99Ms}, {X: float64(len(names)) - 0.5, Y: goalAcquireLoadP99Ms}}, nil})
	}
	for _, g := range goals {
		if err := addReference(p, g); err != nil {
			return nil, err
		}
	}
	p.NominalX(names...)
	p.Legend.Top = true
	return p, nil
}

// latencySeriesPlot draws, for each rep of the load part, the health
// checks' p99 and the slowest Acquire per 250 ms from the reclaiming
// daemon's exec, with the first rep's SERVING, end of the pool fill and
// end of the reclaim marked.
func latencySeriesPlot(l *LoadResult) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("during the reclaim of %d: latency per 250 ms, by rep", l.N)
	p.X.Label.Text = "s from the exec of the daemon"
	p.Y.Label.Text = "ms (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	colors := []color.Color{colorBackground, colorTerm, colorKill, colorAfter, colorSerial}
	ymax := 1.0
	for i, run := range l.Runs {
		var health, acquire plotter.XYs
		for k, b := range run.Series {
			x := (float64(k) + 0.5) * seriesBucket.Seconds()
			if b.Health > 0 {
				health = append(health, plotter.XY{X: x, Y: max(b.HealthP99, minLogMs)})
				ymax = max(ymax, b.HealthP99)
			}
			if b.Acquires > 0 {
				acquire = append(acquire, plotter.XY{X: x, Y: max(b.AcquireMax, minLogMs)})
				ymax = max(ymax, b.AcquireMax)
			}
		}
		col := colors[i%len(colors)]
		if len(health) > 0 {
			line, err := plotter.NewLine(health)
			if err != nil {
				return nil, err
			}
			line.Color = col
			p.Add(line)
			p.Legend.Add(fmt.Sprintf("rep %d: health p99", i+1), line)
		}
		if len(acquire) > 0 {
			sc, err := plotter.NewScatter(acquire)
			if err != nil {
				return nil, err
			}
			sc.Color, sc.Shape = col, draw.CrossGlyph{}
			p.Add(sc)
			p.Legend.Add(fmt.Sprintf("rep %d: slowest Acquire", i+1), sc)
		}
	}
	if len(l.Runs) > 0 {
		r0 := l.Runs[0]
		for _, m := range []struct {
			label string
			ms    float64
			color color.Color
		}{{"rep 1: SERVING", r0.ServingMs, colorTerm}, {"rep 1: pool full", r0.FillEndMs, colorForeground}, {"rep 1: reclaim over", r0.ReclaimEndMs, colorFloor}} {
			if m.ms <= 0 {
				continue
			}
			if err := addReference(p, reference{m.label, plotter.XYs{{X: m.ms / 1000, Y: minLogMs}, {X: m.ms / 1000, Y: ymax}}, m.color}); err != nil {
				return nil, err
			}
		}
	}
	p.Legend.Top = true
	return p, nil
}

// acquirePlot shows each burst's throughput and the pooled p99 of each side.
func acquirePlot(a *AcquireResult) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Acquire over gRPC, %d callers, bursts of %d from a warm pool", a.Clients, a.Calls)
	p.Y.Label.Text = "calls/s (bars: median; dots: each burst)"
	p.Add(plotter.NewGrid())
	sides := []struct {
		label string
		sd    AcquireSide
		color color.Color
	}{
		{fmt.Sprintf("durable record (p99 %s)", fmtMs(a.Durable.Latency.P99Ms)), a.Durable, colorBackground},
		{fmt.Sprintf("in-memory map (p99 %s)", fmtMs(a.Memory.Latency.P99Ms)), a.Memory, colorForeground},
	}
	for i, s := range sides {
		bars, err := plotter.NewBarChart(plotter.Values{s.sd.PerS.Median}, vg.Points(60))
		if err != nil {
			return nil, err
		}
		bars.XMin, bars.Color, bars.LineStyle.Width = float64(i), s.color, 0
		p.Add(bars)
		var dots plotter.XYs
		for _, r := range s.sd.Runs {
			dots = append(dots, plotter.XY{X: float64(i), Y: r.PerS})
		}
		if len(dots) > 0 {
			sc, err := plotter.NewScatter(dots)
			if err != nil {
				return nil, err
			}
			sc.Color = colorFailed
			p.Add(sc)
		}
	}
	p.NominalX(sides[0].label, sides[1].label)
	p.Y.Min = 0
	return p, nil
}

// saveUpgradePlot draws, per scenario, the probes per 100 ms by outcome,
// with the signals marked.
func saveUpgradePlot(u *UpgradeResult, file string) error {
	rows := len(u.Scenarios)
	plots := make([][]*plot.Plot, rows)
	for i, s := range u.Scenarios {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s ×%d: %d refused, %d failed, %d NOT_SERVING of %d", s.Name, s.Events, s.Refused, s.Failed, s.NotServing, s.Probes)
		p.X.Label.Text = "s from the start of the series"
		p.Y.Label.Text = "probes / 100 ms"
		p.Add(plotter.NewGrid())
		ymax := 1.0
		for _, c := range []struct {
			label string
			get   func(Bucket) int
			color color.Color
		}{
			{"SERVING / 200", func(b Bucket) int { return b.Serving }, colorFloor},
			{"NOT_SERVING / 503", func(b Bucket) int { return b.NotServing }, colorForeground},
			{"refused", func(b Bucket) int { return b.Refused }, colorSerial},
			{"failed", func(b Bucket) int { return b.Failed }, colorFailed},
		} {
			xys := make(plotter.XYs, len(s.Series))
			total := 0
			for k, b := range s.Series {
				xys[k] = plotter.XY{X: float64(k) * bucketWidth.Seconds(), Y: float64(c.get(b))}
				total += c.get(b)
				ymax = max(ymax, float64(c.get(b)))
			}
			if total == 0 && c.label != "SERVING / 200" {
				continue
			}
			if len(xys) == 0 {
				continue
			}
			line, err := plotter.NewLine(xys)
			if err != nil {
				return err
			}
			line.Color = c.color
			p.Add(line)
			p.Legend.Add(c.label, line)
		}
		for _, e := range s.EventsMs {
			x := e / 1000
			line, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: ymax}})
			if err != nil {
				return err
			}
			line.Color, line.Dashes = colorGoal, []vg.Length{vg.Points(2), vg.Points(2)}
			p.Add(line)
		}
		p.Legend.Top, p.Legend.Left = true, true
		p.Y.Min = 0
		plots[i] = []*plot.Plot{p}
	}
	img := vgimg.New(plotW, vg.Length(rows)*7*vg.Centimeter)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadX: vg.Points(4), PadY: vg.Points(8)}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
