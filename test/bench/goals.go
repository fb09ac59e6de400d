package main

import (
	"fmt"
	"strings"
)

// Goal statuses.
const (
	goalMet         = "met"
	goalMissed      = "missed"
	goalNotMeasured = "not measured"
)

// Goals of the issue.
const (
	goalAnswerMs       = 50.0 // first health answer, median, every N
	goalAnswerGrowth   = 1.5  // at 10,000 leaked vs at 0
	goalServingVsFloor = 1.5  // time to SERVING vs the kernel floor
	goalSerialSpeedup  = 20.0 // serial baseline / phasegate at 5,000
	goalLoadP99Ms      = 10.0 // health p99 during reclaim
	goalLoadP99VsIdle  = 3.0  // ... vs idle
	goalRSSMiB         = 64.0 // RSS with 10,000 reclaimed and the pool full
	goalBigN           = 10000
	goalMidN           = 5000
	goalLoadN          = 5000
	goalRSSN           = 10000
)

// evaluateGoals checks each goal of the issue against the run's figures.
// Ratios are taken between figures of this run.
func evaluateGoals(r *Results) []Goal {
	goals := []Goal{answerGoal(r), answerGrowthGoal(r)}
	for _, n := range []int{goalMidN, goalBigN} {
		goals = append(goals, servingVsFloorGoal(r, n))
	}
	goals = append(goals, serialSpeedupGoal(r))
	for _, kind := range []string{kindGRPC, kindHTTP} {
		goals = append(goals, loadGoal(r, kind))
	}
	return append(goals, rssGoal(r))
}

// bound returns met/missed for measured ≤ limit and how much it is over.
func bound(measured, limit float64, unit string) (string, string) {
	if measured <= limit {
		return goalMet, ""
	}
	return goalMissed, fmt.Sprintf("over by %.3g%s (%.0f%%)", measured-limit, unit, 100*(measured-limit)/limit)
}

func answerGoal(r *Results) Goal {
	g := Goal{Name: "time to first health answer, median, every N", Target: fmt.Sprintf("≤ %.0f ms", goalAnswerMs)}
	var parts, over []string
	for _, p := range r.Points {
		if p.Strategy != stratPhasegate || !p.measured() {
			continue
		}
		parts = append(parts, fmt.Sprintf("N=%d: %s", p.N, fmtMs(p.FirstAnswerMs.Median)))
		if st, by := bound(p.FirstAnswerMs.Median, goalAnswerMs, " ms"); st == goalMissed {
			over = append(over, fmt.Sprintf("N=%d %s", p.N, by))
		}
	}
	g.Measured = strings.Join(parts, ", ")
	switch {
	case len(parts) == 0:
		g.Status = goalNotMeasured
	case len(over) > 0:
		g.Status, g.Note = goalMissed, strings.Join(over, "; ")
	default:
		g.Status = goalMet
	}
	return g
}

func answerGrowthGoal(r *Results) Goal {
	g := Goal{Name: "time to first health answer at 10,000 leaked vs at 0",
		Target: fmt.Sprintf("≤ %.1f×", goalAnswerGrowth)}
	zero, big := r.find(stratPhasegate, 0), r.find(stratPhasegate, goalBigN)
	if !zero.measured() || !big.measured() {
		g.Status, g.Note = goalNotMeasured, "needs N=0 and N=10000 (-skip-10k leaves 10,000 out)"
		return g
	}
	ratio := big.FirstAnswerMs.Median / zero.FirstAnswerMs.Median
	g.Measured = fmt.Sprintf("%.2f× (%s vs %s)", ratio, fmtMs(big.FirstAnswerMs.Median), fmtMs(zero.FirstAnswerMs.Median))
	g.Status, g.Note = bound(ratio, goalAnswerGrowth, "×")
	return g
}

func servingVsFloorGoal(r *Results, n int) Goal {
	g := Goal{Name: fmt.Sprintf("time to SERVING vs kernel floor at %d", n), Target: fmt.Sprintf("≤ %.1f×", goalServingVsFloor)}
	pg, fl := r.find(stratPhasegate, n), r.find(stratFloor, n)
	if !pg.measured() || !fl.measured() {
		g.Status = goalNotMeasured
		if n >= 10000 {
			g.Note = "N=10000 not run (-skip-10k or -n)"
		}
		return g
	}
	ratio := pg.ServingMs.Median / fl.ServingMs.Median
	g.Measured = fmt.Sprintf("%.2f× (%s vs %s)", ratio, fmtMs(pg.ServingMs.Median), fmtMs(fl.ServingMs.Median))
	g.Status, g.Note = bound(ratio, goalServingVsFloor, "×")
	return g
}

func serialSpeedupGoal(r *Results) Goal {
	g := Goal{Name: fmt.Sprintf("time to SERVING vs serial baseline at %d", goalMidN),
		Target: fmt.Sprintf("≥ %.0f× faster", goalSerialSpeedup)}
	pg, se := r.find(stratPhasegate, goalMidN), r.find(stratSerial, goalMidN)
	if !pg.measured() || se == nil {
		g.Status = goalNotMeasured
		return g
	}
	if !se.measured() {
		g.Status = goalNotMeasured
		if se.Extrapolated != nil {
			g.Note = fmt.Sprintf("serial not run at %d (%s); an extrapolation (%s) would give %.0f×, not a measurement",
				goalMidN, se.Skipped, fmtMs(se.Extrapolated.ServingMs), se.Extrapolated.ServingMs/pg.ServingMs.Median)
		}
		return g
	}
	ratio := se.ServingMs.Median / pg.ServingMs.Median
	g.Measured = fmt.Sprintf("%.0f× (%s vs %s)", ratio, fmtMs(se.ServingMs.Median), fmtMs(pg.ServingMs.Median))
	if ratio >= goalSerialSpeedup {
		g.Status = goalMet
	} else {
		g.Status = goalMissed
		g.Note = fmt.Sprintf("short by %.1f×", goalSerialSpeedup-ratio)
	}
	return g
}

func loadGoal(r *Results, kind string) Goal {
	name := map[string]string{kindGRPC: "gRPC Check", kindHTTP: "HTTP /health"}[kind]
	g := Goal{Name: name + " p99 during a reclaim, errors",
		Target: fmt.Sprintf("p99 ≤ %.0f ms and ≤ %.0f× idle p99, 0 errors", goalLoadP99Ms, goalLoadP99VsIdle)}
	if r.Load == nil {
		g.Status = goalNotMeasured
		return g
	}
	busy, idle := r.Load.Reclaim[kind], r.Load.Idle[kind]
	if busy.Requests == 0 || idle.Requests == 0 || idle.P99Ms == 0 {
		g.Status, g.Note = goalNotMeasured, "no requests fell inside the reclaim window"
		return g
	}
	ratio := busy.P99Ms / idle.P99Ms
	g.Measured = fmt.Sprintf("p99 %s (idle %s, %.2f×), %d errors in %d requests at N=%d",
		fmtMs(busy.P99Ms), fmtMs(idle.P99Ms), ratio, busy.Errors, busy.Requests, r.Load.N)
	var missed []string
	if st, by := bound(busy.P99Ms, goalLoadP99Ms, " ms"); st == goalMissed {
		missed = append(missed, "p99 "+by)
	}
	if st, by := bound(ratio, goalLoadP99VsIdle, "×"); st == goalMissed {
		missed = append(missed, "ratio to idle "+by)
	}
	if busy.Errors > 0 {
		missed = append(missed, fmt.Sprintf("%d errors (first: %s)", busy.Errors, busy.FirstError))
	}
	g.Status = goalMet
	if len(missed) > 0 {
		g.Status, g.Note = goalMissed, strings.Join(missed, "; ")
	}
	if r.Load.N != goalLoadN {
		g.Note = strings.TrimPrefix(g.Note+fmt.Sprintf("; measured at N=%d, the goal is stated for %d", r.Load.N, goalLoadN), "; ")
	}
	return g
}

func rssGoal(r *Results) Goal {
	g := Goal{Name: fmt.Sprintf("daemon RSS after reclaiming %d, pool full", goalRSSN), Target: fmt.Sprintf("≤ %.0f MiB", goalRSSMiB)}
	p := r.find(stratPhasegate, goalRSSN)
	if !p.measured() {
		g.Status, g.Note = goalNotMeasured, "N=10000 not run (-skip-10k or -n)"
		return g
	}
	g.Measured = fmt.Sprintf("%.1f MiB (peak %.1f MiB), pool of %d", p.RSSMiB.Median, p.HWMMiB.Median, r.Settings.PoolSize)
	g.Status, g.Note = bound(p.RSSMiB.Median, goalRSSMiB, " MiB")
	return g
}

// notes lists what the reader must know: skipped points, extrapolations.
func notes(r *Results) []string {
	var out []string
	if r.Settings.Skipped10k {
		out = append(out, "N=10,000 was not run (-skip-10k or not in -n): the goals stated at 10,000 are not measured.")
	}
	for _, p := range r.Points {
		if p.Skipped == "" {
			continue
		}
		s := fmt.Sprintf("%s at N=%d not run (%s)", p.Strategy, p.N, p.Skipped)
		if p.Extrapolated != nil {
			s += fmt.Sprintf("; extrapolated, NOT measured: ~%s to SERVING, %s", fmtMs(p.Extrapolated.ServingMs), p.Extrapolated.Basis)
		}
		out = append(out, s+".")
	}
	return out
}
