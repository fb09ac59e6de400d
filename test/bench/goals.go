package main

import (
	"fmt"
	"slices"
	"strings"
)

// Goal statuses.
const (
	goalMet         = "met"
	goalMissed      = "missed"
	goalNotMeasured = "not measured"
)

// Goals of the issues ("A restart in O(1)", live restore).
const (
	goalAnswerMs          = 50.0  // first health answer, median, every N
	goalServingMs         = 200.0 // SERVING after a restart, median, every N ≤ 10,000, dead or leased
	goalFloorSpeedup      = 10.0  // kernel floor / SERVING at 10,000 dead
	goalGoneVsFloor       = 2.0   // dead gone after SERVING / kernel floor
	goalRestoreServingMs  = 200.0 // SERVING after a restart with N leased, median, every N ≤ 10,000
	goalSerialSpeedup     = 20.0  // serial baseline / SERVING
	goalLoadP99VsControl  = 1.5   // health p99 during the background reclaim / the control server's
	goalAcquireLoadP99Ms  = 50.0  // Acquire p99 during the background reclaim
	goalAcquireVsMemory   = 0.8   // durable / in-memory Acquire throughput
	goalAcquireP99Ms      = 5.0   // durable Acquire p99
	goalRSSMiB            = 64.0  // RSS with 10,000 reclaimed (or restored) and the pool full
	goalFloodVsElsewhere  = 1.5   // health and the owner's Acquire p99 during a flood of the port / during the same flood of another port
	goalUpgrades          = 20
	goalBigN              = 10000
	goalRestoreN          = 5000
	goalLoadN             = goalBigN // health and Acquire latency: during the background reclaim of this many dead
	goalSerialN           = 1000
	goalMaxServingN       = 10000
	defaultStartTimeoutMs = 5 * 60 * 1000.0 // the daemon's --start-timeout default
	noteNeeds10k          = "N=10000 not run (-skip-10k or -n)"
	noteNotMeasuredInPart = "part %s not run"
)

// evaluateGoals checks each goal against the results; every ratio is
// taken between figures of the same run of its part.
func evaluateGoals(r *Results) []Goal {
	goals := []Goal{answerGoal(r), servingGoal(r), floorSpeedupGoal(r), goneGoal(r), restoreGoal(r), guestRestoreGoal(r), policiesGoal(r), datapathRestoreGoal(r), serialGoal(r)}
	for _, checker := range []bool{true, false} {
		for _, kind := range []string{kindGRPC, kindHTTP} {
			goals = append(goals, healthLoadGoal(r, kind, checker))
		}
	}
	goals = append(goals, acquireLoadGoal(r), acquireThroughputGoal(r), acquireP99Goal(r), slotRateGoal(r), upgradeGoal(r), rssGoal(r))
	goals = append(goals, cniGoals(r)...)
	return append(goals, floodGoal(r, []string{kindGRPC, kindHTTP}), floodGoal(r, []string{kindAcquire}))
}

// bound returns met/missed for measured ≤ limit and how much it is over.
func bound(measured, limit float64, unit string) (string, string) {
	if measured <= limit {
		return goalMet, ""
	}
	return goalMissed, fmt.Sprintf("over by %.3g%s (%.0f%%)", measured-limit, unit, 100*(measured-limit)/limit)
}

// verdict turns a list of misses into a status and note.
func verdict(g *Goal, measuredAny bool, misses []string) {
	switch {
	case !measuredAny:
		g.Status = goalNotMeasured
	case len(misses) > 0:
		g.Status, g.Note = goalMissed, strings.Join(misses, "; ")
	default:
		g.Status = goalMet
	}
}

// points returns the measured points of the strategies, by N.
func (r *Results) points(strategies ...string) []*Point {
	var out []*Point
	for _, p := range r.Points {
		if slices.Contains(strategies, p.Strategy) && p.measured() {
			out = append(out, p)
		}
	}
	slices.SortStableFunc(out, func(a, b *Point) int { return a.N - b.N })
	return out
}

func answerGoal(r *Results) Goal {
	g := Goal{Name: "first health answer after exec, median, every N (dead: background; leased: both restarts)", Target: fmt.Sprintf("≤ %.0f ms", goalAnswerMs)}
	var parts, over []string
	for _, p := range r.points(stratBackground, stratRestoreTerm, stratRestoreKill) {
		parts = append(parts, fmt.Sprintf("%s N=%d: %s", p.Strategy, p.N, fmtMs(p.FirstAnswerMs.Median)))
		if st, by := bound(p.FirstAnswerMs.Median, goalAnswerMs, " ms"); st == goalMissed {
			over = append(over, fmt.Sprintf("%s N=%d %s", p.Strategy, p.N, by))
		}
	}
	if len(r.ExecMs) > 0 {
		parts = append(parts, fmt.Sprintf("beside: exec → exit of `phasegate version` (the binary doing nothing) %s", fmtSummary(summarize(r.ExecMs))))
	}
	g.Measured = strings.Join(parts, ", ")
	verdict(&g, len(parts) > 0, over)
	return g
}

func servingGoal(r *Results) Goal {
	g := Goal{Name: "SERVING after a restart (exec → SERVING), median, every N ≤ 10,000, dead (background reclaim) or leased",
		Target: fmt.Sprintf("≤ %.0f ms", goalServingMs)}
	var parts, over []string
	worst := 0.0
	for _, p := range r.Points {
		if slices.Contains(restoreStrategies, p.Strategy) && p.noStarts() > 0 && p.N <= goalMaxServingN {
			parts = append(parts, fmt.Sprintf("%s N=%d: never served (%d starts in a row failed)", p.Strategy, p.N, maxStartAttempts))
			over = append(over, fmt.Sprintf("%s N=%d never served", p.Strategy, p.N))
		}
	}
	for _, p := range r.points(stratBackground, stratRestoreTerm, stratRestoreKill) {
		if p.N > goalMaxServingN {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s N=%d: %s", p.Strategy, p.N, fmtMs(p.ServingMs.Median)))
		worst = max(worst, p.ServingMs.Max)
		if st, by := bound(p.ServingMs.Median, goalServingMs, " ms"); st == goalMissed {
			over = append(over, fmt.Sprintf("%s N=%d %s", p.Strategy, p.N, by))
		}
	}
	if len(parts) > 0 {
		parts = append(parts, "slowest single run "+fmtMs(worst))
	}
	if worst > defaultStartTimeoutMs {
		over = append(over, fmt.Sprintf("a start took %s: with the daemon's default --start-timeout of 5 min it would have failed (the benchmark runs with --start-timeout 0)", fmtMs(worst)))
	}
	g.Measured = strings.Join(parts, ", ")
	verdict(&g, len(parts) > 0, over)
	return g
}

func floorSpeedupGoal(r *Results) Goal {
	g := Goal{Name: fmt.Sprintf("SERVING with %d dead (background) vs the kernel floor's removal of them", goalBigN),
		Target: fmt.Sprintf("≥ %.0f× faster", goalFloorSpeedup)}
	bg, fl := r.find(stratBackground, goalBigN), r.find(stratFloor, goalBigN)
	if !bg.measured() || !fl.measured() {
		g.Status, g.Note = goalNotMeasured, noteNeeds10k
		return g
	}
	ratio := fl.ServingMs.Median / bg.ServingMs.Median
	g.Measured = fmt.Sprintf("%.1f× (%s vs floor %s)", ratio, fmtMs(bg.ServingMs.Median), fmtMs(fl.ServingMs.Median))
	var misses []string
	if ratio < goalFloorSpeedup {
		misses = append(misses, fmt.Sprintf("short by %.1f×", goalFloorSpeedup-ratio))
	}
	verdict(&g, true, misses)
	return g
}

func goneGoal(r *Results) Goal {
	g := Goal{Name: "dead slots all gone, counted from SERVING (background reclaim), vs the kernel floor, every N > 0",
		Target: fmt.Sprintf("≤ %.0f×", goalGoneVsFloor)}
	var parts, over []string
	for _, p := range r.points(stratBackground) {
		fl := r.find(stratFloor, p.N)
		if p.N == 0 || !fl.measured() {
			continue
		}
		ratio := p.AfterServingMs.Median / fl.ServingMs.Median
		parts = append(parts, fmt.Sprintf("N=%d: %.2f× (%s vs %s)", p.N, ratio, fmtMs(p.AfterServingMs.Median), fmtMs(fl.ServingMs.Median)))
		if st, by := bound(ratio, goalGoneVsFloor, "×"); st == goalMissed {
			over = append(over, fmt.Sprintf("N=%d %s", p.N, by))
		}
	}
	g.Measured = strings.Join(parts, ", ")
	verdict(&g, len(parts) > 0, over)
	return g
}

func restoreGoal(r *Results) Goal {
	g := Goal{Name: "leased slots across a restart (SIGTERM and kill -9), every N ≤ 10,000: SERVING after exec (median), every lease restored (verified after SERVING), destroyed",
		Target: fmt.Sprintf("SERVING ≤ %.0f ms, N/N restored, 0 lost, 0 destroyed, every run", goalRestoreServingMs)}
	parts, misses, any := restoreFigures(r, restoreStrategies)
	n := goalRestoreN
	if fg, fl := r.find(stratForeground, n), r.find(stratFloor, n); any && fg.measured() && fl.measured() {
		parts = append(parts, fmt.Sprintf("beside: the start before live restore (--reclaim=foreground, which destroys all %d) %s, kernel floor %s",
			n, fmtMs(fg.ServingMs.Median), fmtMs(fl.ServingMs.Median)))
	}
	g.Measured = strings.Join(parts, "; ")
	verdict(&g, any, misses)
	return g
}

// guestRestoreGoal is restoreGoal for the guest+policy variant, with the
// ratio of its SERVING to the plain variant's at the same N, same run.
func guestRestoreGoal(r *Results) Goal {
	g := Goal{Name: "leased slots with the microVM guest profile and an egress policy each, across a restart (SIGTERM and kill -9), every N ≤ 10,000: " +
		"SERVING after exec (median; and its ratio to the plain variant's at the same N, same run), every lease restored (verified after SERVING), destroyed",
		Target: fmt.Sprintf("SERVING ≤ %.0f ms, N/N restored, 0 lost, 0 destroyed, every run", goalRestoreServingMs)}
	parts, misses, any := restoreFigures(r, guestStrategies)
	if !any {
		g.Status, g.Note = goalNotMeasured, "part restore not run, or -restore-guest=false"
		return g
	}
	var ratios []string
	for _, p := range r.points(guestStrategies...) {
		if ratio, ok := r.servingVsPlain(p); ok {
			ratios = append(ratios, fmt.Sprintf("%s N=%d: %.2f×", p.Strategy, p.N, ratio))
		}
	}
	if len(ratios) > 0 {
		parts = append(parts, "SERVING vs plain: "+strings.Join(ratios, ", "))
	}
	g.Measured = strings.Join(parts, "; ")
	verdict(&g, any, misses)
	return g
}

// servingVsPlain is the median SERVING of p, a point of a restore variant,
// against the plain variant's at the same N in the same results; false
// when there is no plain point to compare with.
func (r *Results) servingVsPlain(p *Point) (float64, bool) {
	plain := r.find(plainOf[p.Strategy], p.N)
	if !plain.measured() || plain.ServingMs.Median <= 0 {
		return 0, false
	}
	return p.ServingMs.Median / plain.ServingMs.Median, true
}

// restoreFigures states each restore point of strategies (N ≤ 10,000)
// against the restore goal: what was measured, what misses it, and
// whether anything was.
func restoreFigures(r *Results, strategies []string) (parts, misses []string, any bool) {
	for _, p := range r.Points {
		if slices.Contains(strategies, p.Strategy) && p.noStarts() > 0 && p.N <= goalMaxServingN {
			any = true
			misses = append(misses, fmt.Sprintf("%s N=%d: in %d of %d restarts the daemon never served (%d starts in a row failed; first: %s)",
				p.Strategy, p.N, p.noStarts(), len(p.Runs), maxStartAttempts, firstOr(failedStarts(p), "?")))
			parts = append(parts, fmt.Sprintf("%s N=%d: no start", p.Strategy, p.N))
		}
	}
	for _, p := range r.points(strategies...) {
		if p.N > goalMaxServingN {
			continue
		}
		any = true
		n := p.N
		w := worstRestore(p)
		parts = append(parts, fmt.Sprintf("%s N=%d: SERVING %s (max %s), all verified %s, restored ≥ %d/%d, listed ≥ %d, lost ≤ %d, destroyed ≤ %d over %d runs",
			p.Strategy, n, fmtMs(p.ServingMs.Median), fmtMs(p.ServingMs.Max), fmtVerified(p), w.Restored, n, w.Listed, w.Lost, w.Destroyed, len(p.Runs)))
		if st, by := bound(p.ServingMs.Median, goalRestoreServingMs, " ms"); st == goalMissed {
			misses = append(misses, fmt.Sprintf("%s N=%d SERVING %s", p.Strategy, n, by))
		}
		if w.Restored < n || w.Listed < n || w.Lost > 0 {
			misses = append(misses, fmt.Sprintf("%s N=%d: only %d restored, %d listed, %d lost", p.Strategy, n, w.Restored, w.Listed, w.Lost))
		}
		if w.Destroyed > 0 {
			misses = append(misses, fmt.Sprintf("%s N=%d: %d leased slots destroyed", p.Strategy, n, w.Destroyed))
		}
		if f := failedStarts(p); len(f) > 0 {
			misses = append(misses, fmt.Sprintf("%s N=%d: %d starts failed and were started again (first: %s)", p.Strategy, n, len(f), f[0]))
		}
	}
	return parts, misses, any
}

// policiesGoal: after every restart of the guest+policy variant, every
// lease shows the policy it was acquired with, the sampled namespaces are
// as they were, and the daemon's own check repaired nothing.
func policiesGoal(r *Results) Goal {
	g := Goal{Name: "egress policies and guest devices across every restart of the guest+policy variant: each lease's policy in List as it was acquired, " +
		fmt.Sprintf("the tables, rules (by handle) and tap of %d sampled namespaces unchanged (nft, ip), repaired by the daemon's verify-inside", guestSample),
		Target: "N/N policies, every sample unchanged, 0 repaired, every run"}
	var parts, misses []string
	any := false
	for _, p := range r.points(guestStrategies...) {
		if p.N == 0 {
			continue
		}
		any = true
		minPol, minSample, sampled, maxRepaired := p.N, guestSample, 0, 0
		var diffs []string
		for _, run := range p.Runs {
			if run.NoStart {
				continue
			}
			minPol, maxRepaired = min(minPol, run.PoliciesKept), max(maxRepaired, run.InsideRepaired)
			minSample, sampled = min(minSample, run.InsideKept), max(sampled, run.InsideSampled)
			diffs = append(diffs, run.PolicyDiffs...)
		}
		minSample = min(minSample, sampled)
		parts = append(parts, fmt.Sprintf("%s N=%d: policies kept ≥ %d/%d, samples unchanged ≥ %d/%d, repaired ≤ %d, inside verified %s after exec, over %d runs",
			p.Strategy, p.N, minPol, p.N, minSample, sampled, maxRepaired, fmtSummary(p.InsideMs), len(p.Runs)))
		if minPol < p.N || minSample < sampled || sampled == 0 || maxRepaired > 0 {
			misses = append(misses, fmt.Sprintf("%s N=%d: %d/%d policies kept, %d/%d samples unchanged, %d repaired (first: %s)",
				p.Strategy, p.N, minPol, p.N, minSample, sampled, maxRepaired, firstOr(diffs, "—")))
		}
	}
	g.Measured = strings.Join(parts, "; ")
	verdict(&g, any, misses)
	return g
}

func serialGoal(r *Results) Goal {
	g := Goal{Name: "SERVING vs the serial baseline at the largest N it ran (≤ 1,000)", Target: fmt.Sprintf("≥ %.0f× faster", goalSerialSpeedup)}
	var se, bg *Point
	for _, p := range r.points(stratSerial) {
		if p.N > 0 && r.find(stratBackground, p.N).measured() {
			se, bg = p, r.find(stratBackground, p.N)
		}
	}
	if se == nil {
		g.Status = goalNotMeasured
		return g
	}
	ratio := se.ServingMs.Median / bg.ServingMs.Median
	g.Measured = fmt.Sprintf("N=%d: %.0f× (%s vs %s)", se.N, ratio, fmtMs(se.ServingMs.Median), fmtMs(bg.ServingMs.Median))
	var misses []string
	if ratio < goalSerialSpeedup {
		misses = append(misses, fmt.Sprintf("short by %.1f×", goalSerialSpeedup-ratio))
	}
	verdict(&g, true, misses)
	return g
}

func healthLoadGoal(r *Results, kind string, checker bool) Goal {
	name := map[string]string{kindGRPC: "gRPC Check", kindHTTP: "HTTP /health"}[kind]
	g := Goal{Target: fmt.Sprintf("p99 ≤ %.1f× the control server's, 0 errors, 0 answers over 1 s", goalLoadP99VsControl)}
	if r.Load == nil {
		g.Name = fmt.Sprintf("%s p99 during the background reclaim of %d dead, vs a control server", name, goalLoadN)
		g.Status, g.Note = goalNotMeasured, fmt.Sprintf(noteNotMeasuredInPart, partLoad)
		return g
	}
	busy, ctl := r.Load.Reclaim[kind], r.Load.Control[kind]
	rates := fmt.Sprintf("at %d/s (half HTTP on keep-alive connections, half gRPC)", r.Load.Rate)
	if checker {
		c := r.Load.Checker
		if c == nil {
			g.Name = fmt.Sprintf("%s p99 during the background reclaim of %d dead at checker rates, vs a control server", name, goalLoadN)
			g.Status, g.Note = goalNotMeasured, "no checker-rate run in these results"
			return g
		}
		busy, ctl = c.Reclaim[kind], c.Control[kind]
		rates = fmt.Sprintf("at checker rates (%d HTTP/s on a new connection each, %d gRPC/s)", c.HTTPRate, c.GRPCRate)
	}
	g.Name = fmt.Sprintf("%s p99 during the background reclaim of %d dead %s, vs a control server", name, goalLoadN, rates)
	if busy.Requests == 0 || ctl.Requests == 0 || ctl.P99Ms == 0 {
		g.Status, g.Note = goalNotMeasured, "no requests fell inside the reclaim window"
		return g
	}
	ratio := busy.P99Ms / ctl.P99Ms
	g.Measured = fmt.Sprintf("p99 %s (control %s: %.2f×), max %s (control %s), %d errors and %d over 1 s in %d requests (control: %d, %d in %d), N=%d",
		fmtMs(busy.P99Ms), fmtMs(ctl.P99Ms), ratio, fmtMs(busy.MaxMs), fmtMs(ctl.MaxMs), busy.Errors, busy.Over1s, busy.Requests,
		ctl.Errors, ctl.Over1s, ctl.Requests, r.Load.N)
	var misses []string
	if st, by := bound(ratio, goalLoadP99VsControl, "×"); st == goalMissed {
		misses = append(misses, "ratio to the control "+by)
	}
	if busy.Errors > 0 {
		misses = append(misses, fmt.Sprintf("%d errors (first: %s)", busy.Errors, busy.FirstError))
	}
	if busy.Over1s > 0 {
		misses = append(misses, fmt.Sprintf("%d answers over 1 s", busy.Over1s))
	}
	verdict(&g, true, misses)
	atN(&g, r.Load.N, goalLoadN)
	return g
}

// atN notes a goal measured at another N than the one it is stated for.
func atN(g *Goal, n, want int) {
	if n != want {
		g.Note = strings.TrimPrefix(g.Note+fmt.Sprintf("; measured at N=%d, the goal is stated for %d", n, want), "; ")
	}
}

func acquireLoadGoal(r *Results) Goal {
	g := Goal{Name: fmt.Sprintf("Acquire p99 during the background reclaim of %d dead, errors", goalLoadN),
		Target: fmt.Sprintf("p99 ≤ %.0f ms, 0 errors", goalAcquireLoadP99Ms)}
	if r.Load == nil || r.Load.AcquireRate == 0 {
		g.Status, g.Note = goalNotMeasured, "part load not run, or -acquire-rate 0"
		return g
	}
	busy, idle, start := r.Load.Reclaim[kindAcquire], r.Load.Idle[kindAcquire], r.Load.Start[kindAcquire]
	if busy.Requests == 0 {
		g.Status, g.Note = goalNotMeasured, "no Acquire fell inside the reclaim window"
		return g
	}
	g.Measured = fmt.Sprintf("p99 %s (idle %s; after a start with nothing to reclaim %s), max %s, %d errors in %d calls at %d/s, N=%d",
		fmtMs(busy.P99Ms), fmtMs(idle.P99Ms), fmtMs(start.P99Ms), fmtMs(busy.MaxMs), busy.Errors, busy.Requests, r.Load.AcquireRate, r.Load.N)
	var misses []string
	if st, by := bound(busy.P99Ms, goalAcquireLoadP99Ms, " ms"); st == goalMissed {
		misses = append(misses, "p99 "+by)
	}
	if busy.Errors > 0 {
		misses = append(misses, fmt.Sprintf("%d errors (first: %s)", busy.Errors, busy.FirstError))
	}
	verdict(&g, true, misses)
	atN(&g, r.Load.N, goalLoadN)
	return g
}

func acquireThroughputGoal(r *Results) Goal {
	g := Goal{Name: "Acquire throughput over gRPC, durable record vs in-memory map", Target: fmt.Sprintf("≥ %.1f×", goalAcquireVsMemory)}
	a := r.Acquire
	if a == nil || a.Durable.PerS.Count == 0 || a.Memory.PerS.Count == 0 {
		g.Status, g.Note = goalNotMeasured, fmt.Sprintf(noteNotMeasuredInPart, partAcquire)
		return g
	}
	ratio := a.Durable.PerS.Median / a.Memory.PerS.Median
	g.Measured = fmt.Sprintf("%.2f× (%.0f vs %.0f calls/s, median of %d bursts of %d, %d callers)",
		ratio, a.Durable.PerS.Median, a.Memory.PerS.Median, a.Reps, a.Calls, a.Clients)
	var misses []string
	if ratio < goalAcquireVsMemory {
		misses = append(misses, fmt.Sprintf("short by %.2f×", goalAcquireVsMemory-ratio))
	}
	verdict(&g, true, misses)
	return g
}

func acquireP99Goal(r *Results) Goal {
	g := Goal{Name: "Acquire p99 over gRPC with the durable record, errors", Target: fmt.Sprintf("≤ %.0f ms, 0 errors", goalAcquireP99Ms)}
	a := r.Acquire
	if a == nil || a.Durable.Latency.Requests == 0 {
		g.Status, g.Note = goalNotMeasured, fmt.Sprintf(noteNotMeasuredInPart, partAcquire)
		return g
	}
	d, m := a.Durable.Latency, a.Memory.Latency
	g.Measured = fmt.Sprintf("p99 %s (in-memory %s), %d errors in %d calls", fmtMs(d.P99Ms), fmtMs(m.P99Ms), d.Errors, d.Requests)
	var misses []string
	if st, by := bound(d.P99Ms, goalAcquireP99Ms, " ms"); st == goalMissed {
		misses = append(misses, "p99 "+by)
	}
	if d.Errors > 0 {
		misses = append(misses, fmt.Sprintf("%d errors (first: %s)", d.Errors, d.FirstError))
	}
	verdict(&g, true, misses)
	return g
}

func upgradeGoal(r *Results) Goal {
	g := Goal{Name: fmt.Sprintf("new connections across %d SIGHUP upgrades in a row: refused, failed (NOT_SERVING answers allowed)", goalUpgrades),
		Target: "0 refused, 0 failed; leases kept"}
	if r.Upgrade == nil {
		g.Status, g.Note = goalNotMeasured, fmt.Sprintf(noteNotMeasuredInPart, partUpgrade)
		return g
	}
	i := slices.IndexFunc(r.Upgrade.Scenarios, func(s Scenario) bool { return s.Name == scenUpgrade })
	if i < 0 {
		g.Status = goalNotMeasured
		return g
	}
	s := r.Upgrade.Scenarios[i]
	g.Measured = fmt.Sprintf("%d upgrades, %d probes at %d/s: %d refused, %d failed, %d NOT_SERVING; %d/%d leases restored at each, %d destroyed",
		s.Events, s.Probes, r.Upgrade.Rate, s.Refused, s.Failed, s.NotServing, s.Restored, r.Upgrade.Leases, s.Destroyed)
	var misses []string
	if s.Refused > 0 || s.Failed > 0 {
		misses = append(misses, fmt.Sprintf("%d refused, %d failed (first: %s)", s.Refused, s.Failed, s.FirstError))
	}
	if s.Restored < r.Upgrade.Leases || s.Destroyed > 0 {
		misses = append(misses, fmt.Sprintf("leases: %d restored, %d destroyed", s.Restored, s.Destroyed))
	}
	verdict(&g, true, misses)
	if s.Events < goalUpgrades {
		g.Note = strings.TrimPrefix(g.Note+fmt.Sprintf("; %d upgrades, the goal is stated for %d", s.Events, goalUpgrades), "; ")
	}
	return g
}

func rssGoal(r *Results) Goal {
	g := Goal{Name: fmt.Sprintf("daemon RSS with %d dead reclaimed or %d leases restored, pool full", goalBigN, goalBigN), Target: fmt.Sprintf("≤ %.0f MiB", goalRSSMiB)}
	var parts, over []string
	for _, s := range []string{stratBackground, stratRestoreTerm, stratRestoreKill} {
		p := r.find(s, goalBigN)
		if !p.measured() {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: %.1f MiB (peak %.1f MiB)", s, p.RSSMiB.Median, p.HWMMiB.Median))
		if st, by := bound(p.RSSMiB.Median, goalRSSMiB, " MiB"); st == goalMissed {
			over = append(over, s+" "+by)
		}
	}
	g.Measured = strings.Join(parts, ", ")
	verdict(&g, len(parts) > 0, over)
	if len(parts) == 0 {
		g.Note = noteNeeds10k
	}
	return g
}

// firstOr returns the first of xs, or def.
func firstOr(xs []string, def string) string {
	if len(xs) == 0 {
		return def
	}
	return xs[0]
}

// failedStarts lists why starts of the point's runs failed.
func failedStarts(p *Point) []string {
	var out []string
	for _, r := range p.Runs {
		out = append(out, r.FailedStarts...)
	}
	return out
}

// notes lists what the reader must know: skipped points, extrapolations,
// parts that did not finish.
func notes(r *Results) []string {
	var out []string
	if len(r.ns(deadStrategies)) > 0 && !slices.Contains(r.ns(deadStrategies), goalBigN) {
		out = append(out, "N=10,000 was not run (-skip-10k or not in -n): the goals stated at 10,000 are not measured.")
	}
	for _, p := range r.Points {
		if p.Skipped == "" {
			continue
		}
		if p.measured() {
			out = append(out, fmt.Sprintf("%s at N=%d: %d run(s) only, %s.", p.Strategy, p.N, len(p.Runs), p.Skipped))
			continue
		}
		s := fmt.Sprintf("%s at N=%d not run (%s)", p.Strategy, p.N, p.Skipped)
		if p.Extrapolated != nil {
			s += fmt.Sprintf("; extrapolated, NOT measured: ~%s to SERVING, %s", fmtMs(p.Extrapolated.ServingMs), p.Extrapolated.Basis)
		}
		out = append(out, s+".")
	}
	for _, p := range r.Points {
		var served, never []string
		for _, run := range p.Runs {
			if run.NoStart {
				never = append(never, run.FailedStarts...)
			} else {
				served = append(served, run.FailedStarts...)
			}
		}
		if len(served) > 0 {
			out = append(out, fmt.Sprintf("%s at N=%d: %d start(s) failed — the daemon exited and was started again, as a supervisor would; "+
				"the times include it. First: `%s`.", p.Strategy, p.N, len(served), served[0]))
		}
		if len(never) > 0 {
			out = append(out, fmt.Sprintf("%s at N=%d: the daemon never served: %d starts in a row exited (systemd's default StartLimitBurst "+
				"is 5); the benchmark then removed the slots and went on. First: `%s`.", p.Strategy, p.N, len(never), never[0]))
		}
	}
	if r.Upgrade != nil {
		for _, s := range r.Upgrade.Scenarios {
			if len(s.FailedStarts) > 0 {
				out = append(out, fmt.Sprintf("%s: %d start(s) failed and were started again. First: `%s`.", s.Name, len(s.FailedStarts), s.FailedStarts[0]))
			}
		}
	}
	for _, name := range allParts {
		if p := r.Parts[name]; p != nil && p.Incomplete != "" {
			out = append(out, fmt.Sprintf("INCOMPLETE: part %s stopped: %s", name, p.Incomplete))
		}
	}
	return out
}

// floodGoal compares the p99 of kinds during a flood of the daemon's port
// with their p99 during the same flood aimed elsewhere on the machine (what
// the daemon adds to what the flood costs any process), shows the quiet
// run's beside them, and counts errors.
func floodGoal(r *Results, kinds []string) Goal {
	g := Goal{Target: fmt.Sprintf("p99 ≤ %.1f× its p99 while the same flood hits a bare socket on another port, 0 errors", goalFloodVsElsewhere)}
	g.Name = "health p99 (HTTP /health and gRPC Check, a new connection each) during a connection flood of the port from another user"
	if kinds[0] == kindAcquire {
		g.Name = "the owner's Acquire p99 (control socket) during a connection flood of the port from another user"
	}
	f := r.Flood
	if f == nil {
		g.Status, g.Note = goalNotMeasured, fmt.Sprintf(noteNotMeasuredInPart, partFlood)
		return g
	}
	var parts, misses []string
	for _, k := range kinds {
		fl, el, q := f.Flood[k], f.Elsewhere[k], f.Quiet[k]
		if fl.Requests == 0 || el.Requests == 0 || el.P99Ms == 0 {
			continue
		}
		ratio := fl.P99Ms / el.P99Ms
		parts = append(parts, fmt.Sprintf("%s p99 %s (the flood elsewhere %s: %.2f×; quiet %s), max %s, %d errors in %d",
			k, fmtMs(fl.P99Ms), fmtMs(el.P99Ms), ratio, fmtMs(q.P99Ms), fmtMs(fl.MaxMs), fl.Errors, fl.Requests))
		if st, by := bound(ratio, goalFloodVsElsewhere, "×"); st == goalMissed {
			misses = append(misses, k+" "+by)
		}
		if fl.Errors > 0 {
			misses = append(misses, fmt.Sprintf("%s: %d errors (first: %s)", k, fl.Errors, fl.FirstError))
		}
	}
	g.Measured = strings.Join(parts, "; ")
	verdict(&g, len(parts) > 0, misses)
	return g
}
