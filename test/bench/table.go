package main

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// printTable writes the human-readable summary: a table or a few lines
// for each part that ran, the goals, and the machine.
func printTable(w io.Writer, res *Results) {
	printDeadTable(w, res)
	printRestoreTable(w, res)
	if l := res.Load; l != nil {
		printLoadTable(w, l)
	}
	if a := res.Acquire; a != nil {
		printAcquire(w, a)
	}
	if c := res.CNI; c != nil {
		printCNI(w, c)
	}
	if s := res.SlotRate; s != nil {
		printSlotRate(w, s)
	}
	if u := res.Upgrade; u != nil {
		printUpgrade(w, u)
	}
	if f := res.Flood; f != nil {
		printFlood(w, f)
	}
	if ab := res.AB; ab != nil {
		printAB(w, ab)
	}
	printGoalsAndMachine(w, res)
}

// printDeadTable writes the starts with N dead slots, one row per N and
// strategy (those not run say why, with their extrapolation).
func printDeadTable(w io.Writer, res *Results) {
	if ns := res.ns(deadStrategies); len(ns) > 0 {
		fmt.Fprintln(w, "restart with N dead slots (median [min–max]):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "N\tstrategy\truns\tfirst HTTP answer\tSERVING\tdead gone (exec →)\tgone after SERVING\tRSS MiB")
		for _, n := range ns {
			for _, s := range deadStrategies {
				p := res.find(s, n)
				if p == nil {
					continue
				}
				if !p.measured() {
					est := ""
					if p.Extrapolated != nil {
						est = fmt.Sprintf("extrapolated, not measured: ~%s to SERVING", fmtMs(p.Extrapolated.ServingMs))
					}
					fmt.Fprintf(tw, "%d\t%s\t0\tnot run: %s\t%s\t\t\t\n", n, s, orDash(p.Skipped), est)
					continue
				}
				answer, after, rss := "—", "—", "—"
				if s != stratFloor {
					answer, rss = fmtSummary(p.FirstAnswerMs), fmt.Sprintf("%.1f", p.RSSMiB.Median)
				}
				if s == stratBackground && n > 0 {
					after = fmtSummary(p.AfterServingMs)
				}
				gone := "—"
				if n > 0 {
					gone = fmtSummary(p.DeadGoneMs)
				}
				fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", n, s, len(p.Runs), answer, fmtSummary(p.ServingMs), gone, after, rss)
			}
		}
		tw.Flush()
	}
}

// printRestoreTable writes the starts with N leased slots, one row per N
// and restart, with the worst run's counts and guest checks.
func printRestoreTable(w io.Writer, res *Results) {
	if ns := res.ns(allRestoreStrategies); len(ns) > 0 {
		fmt.Fprintln(w, "\nrestart with N leased slots (median [min–max]; restored/listed/destroyed and the guest checks: worst run):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "N\trestart\truns\tfirst HTTP answer\tSERVING\tall verified\trestored\tlisted\tlost\tdestroyed\tRSS MiB\tinside verified\tpolicies, samples, repaired")
		for _, n := range ns {
			for _, s := range allRestoreStrategies {
				p := res.find(s, n)
				if p != nil && p.noStarts() > 0 {
					fmt.Fprintf(tw, "%d\t%s\t%d\tnever served: %d starts in a row failed\t\t\t\t\t\t\t\t\t\n", n, s, p.noStarts(), maxStartAttempts)
				}
				if !p.measured() {
					continue
				}
				w := worstRestore(p)
				inside, checks := guestColumns(p, w)
				fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%.1f\t%s\t%s\n", n, s, len(p.Runs), fmtSummary(p.FirstAnswerMs),
					fmtSummary(p.ServingMs), fmtVerified(p), w.Restored, w.Listed, w.Lost, w.Destroyed, p.RSSMiB.Median, inside, checks)
			}
		}
		tw.Flush()
	}
}

// printLoadTable writes the latency of each request kind in each window
// of the load part.
func printLoadTable(w io.Writer, l *LoadResult) {
	fmt.Fprintf(w, "\nlatency at %d health checks/s and %d Acquire/s, %d reps:\n", l.Rate, l.AcquireRate, l.Reps)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tkind\trequests\terrors\tp50\tp99\tmax\tp99 per rep\tgenerator lag p99")
	for _, c := range loadWindows(l) {
		for _, k := range []string{kindGRPC, kindHTTP, kindAcquire} {
			if st, ok := c.m[k]; ok {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", c.name, k, st.Requests, st.Errors, fmtMs(st.P50Ms),
					fmtMs(st.P99Ms), fmtMs(st.MaxMs), perRepP99(l, c.pick, k), fmtMs(st.LagP99Ms))
			}
		}
	}
	tw.Flush()
}

// printAcquire writes the Acquire comparison, durable beside in memory.
func printAcquire(w io.Writer, a *AcquireResult) {
	fmt.Fprintf(w, "\nAcquire, %d calls per burst, %d callers, %d bursts per side:\n", a.Calls, a.Clients, a.Reps)
	for _, s := range []struct {
		name string
		sd   AcquireSide
	}{{sideDurable, a.Durable}, {sideMemory, a.Memory}} {
		fmt.Fprintf(w, "  %-8s %s calls/s, p50 %s, p99 %s, max %s, %d errors\n", s.name, fmtRate(s.sd.PerS),
			fmtMs(s.sd.Latency.P50Ms), fmtMs(s.sd.Latency.P99Ms), fmtMs(s.sd.Latency.MaxMs), s.sd.Latency.Errors)
	}
}

// printUpgrade writes each upgrade scenario's gap and probes.
func printUpgrade(w io.Writer, u *UpgradeResult) {
	fmt.Fprintf(w, "\nnew connections at %d/s, %d leases held:\n", u.Rate, u.Leases)
	for _, s := range u.Scenarios {
		fmt.Fprintf(w, "  %s ×%d: signal → SERVING %s; %d probes: %d SERVING, %d NOT_SERVING, %d refused, %d failed; leases restored ≥ %d, destroyed %d\n",
			s.Name, s.Events, fmtSummary(s.GapMs), s.Probes, s.Serving, s.NotServing, s.Refused, s.Failed, s.Restored, s.Destroyed)
	}
}

// printFlood writes the flood part's p99 and errors in each window.
func printFlood(w io.Writer, f *FloodResult) {
	fmt.Fprintf(w, "\na connection flood of the port from %s, %d reps of %s windows:\n", floodUser, f.Reps, fmtMs(f.WindowMs))
	for _, k := range []string{kindGRPC, kindHTTP, kindAcquire} {
		q, fl, el := f.Quiet[k], f.Flood[k], f.Elsewhere[k]
		fmt.Fprintf(w, "  %-8s p99 quiet %s, flooded %s, flood elsewhere %s; errors %d, %d, %d\n", k,
			fmtMs(q.P99Ms), fmtMs(fl.P99Ms), fmtMs(el.P99Ms), q.Errors, fl.Errors, el.Errors)
	}
}

// printGoalsAndMachine writes the goals (never asserted), the notes and
// the machine with each part's time and load.
func printGoalsAndMachine(w io.Writer, res *Results) {
	fmt.Fprintln(w, "\ngoals (never asserted):")
	for _, g := range res.Goals {
		fmt.Fprintf(w, "  [%s] %s %s: %s", g.Status, g.Name, g.Target, g.Measured)
		if g.Note != "" {
			fmt.Fprintf(w, " — %s", g.Note)
		}
		fmt.Fprintln(w)
	}
	for _, n := range res.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	m := res.Machine
	fmt.Fprintf(w, "\nmachine: %d CPUs (%s), Linux %s, %s, state dir on %s\n", m.NumCPU, m.CPU, m.Kernel, m.Go, m.StateFS)
	for _, name := range allParts {
		if p := res.Parts[name]; p != nil {
			fmt.Fprintf(w, "  part %-8s %s, %.0f min, load average %.2f–%.2f (min %.2f, max %.2f)\n", name,
				p.Started.UTC().Format("2006-01-02 15:04 UTC"), p.Finished.Sub(p.Started).Minutes(), p.Load.Start, p.Load.End, p.Load.Min, p.Load.Max)
		}
	}
}

// fmtVerified is a restore point's exec → every lease verified, or "—"
// when it restored none.
func fmtVerified(p *Point) string {
	if p.N == 0 {
		return "—"
	}
	return fmtSummary(p.VerifiedMs)
}

// worstRestore returns, over a restore point's runs, the fewest restored
// and listed and the most lost and destroyed.
func worstRestore(p *Point) Run {
	w := Run{Restored: p.N, Listed: p.N, PoliciesKept: p.N, InsideKept: guestSample}
	for _, r := range p.Runs {
		if r.NoStart {
			continue
		}
		w.Restored, w.Listed = min(w.Restored, r.Restored), min(w.Listed, r.Listed)
		w.Lost, w.Destroyed = max(w.Lost, r.Lost), max(w.Destroyed, r.Destroyed)
		w.Adopted = max(w.Adopted, r.Adopted)
		w.PoliciesKept, w.PoliciesChecked = min(w.PoliciesKept, r.PoliciesKept), max(w.PoliciesChecked, r.PoliciesChecked)
		w.InsideKept, w.InsideSampled = min(w.InsideKept, r.InsideKept), max(w.InsideSampled, r.InsideSampled)
		w.InsideRepaired = max(w.InsideRepaired, r.InsideRepaired)
	}
	return w
}

// guestColumns are a restore point's exec → inside verified and its worst
// guest checks ("—" for the plain variant and at N=0).
func guestColumns(p *Point, w Run) (inside, checks string) {
	if !slices.Contains(guestStrategies, p.Strategy) || p.N == 0 {
		return "—", "—"
	}
	return fmtSummary(p.InsideMs), fmt.Sprintf("%d/%d, %d/%d, %d", w.PoliciesKept, p.N, w.InsideKept, w.InsideSampled, w.InsideRepaired)
}

// fmtRate formats a throughput summary.
func fmtRate(s Summary) string {
	if s.Count == 0 {
		return "—"
	}
	if s.Count == 1 {
		return fmt.Sprintf("%.0f", s.Median)
	}
	return fmt.Sprintf("%.0f [%.0f–%.0f]", s.Median, s.Min, s.Max)
}
