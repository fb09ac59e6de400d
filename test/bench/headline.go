package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Markers delimiting the -headline file's generated table: the few figures
// the README leads with, rendered from the same results as the -doc
// report, so that the two never tell different stories.
const (
	headlineStart = "<!-- headline:start -->"
	headlineEnd   = "<!-- headline:end -->"
)

// errNoHeadline is headline's answer for results without a restart
// measured at any N > 0.
var errNoHeadline = errors.New("no restart with dead or leased slots in the results")

// headline renders the README's table: a restart at the largest N
// measured with dead slots (background, foreground, the serial start)
// and with leased ones (plain and with the guest profile), then the
// upgrades. A row whose part is missing from res is left out.
func headline(res *Results) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured on a %d-core machine (docs/BENCHMARKS.md: how, the spread, and the goals missed):\n\n", res.Machine.NumCPU)
	b.WriteString("| a restart of the daemon on a host with… | port answers | SERVING | what happens to the slots |\n|---|---:|---:|---|\n")
	rows := 0
	if n := largestN(res, stratBackground); n > 0 {
		bg, fl := res.find(stratBackground, n), res.find(stratFloor, n)
		what := "torn down in the background: " + fmtMs(bg.AfterServingMs.Median) + " after SERVING"
		if fl.measured() {
			what += fmt.Sprintf(", %.2f× the kernel's own floor (%s)", bg.AfterServingMs.Median/fl.ServingMs.Median, fmtMs(fl.ServingMs.Median))
		}
		fmt.Fprintf(&b, "| %s leaked (dead) slots | %s | %s | %s |\n", thousands(n), fmtMs(bg.FirstAnswerMs.Median), fmtMs(bg.ServingMs.Median), what)
		rows++
		if fg := res.find(stratForeground, n); fg.measured() {
			fmt.Fprintf(&b, "| the same with `--reclaim=foreground` (the start before live restore) | %s | %s | torn down before serving |\n",
				fmtMs(fg.FirstAnswerMs.Median), fmtMs(fg.ServingMs.Median))
		}
		if m := largestN(res, stratSerial); m > 0 {
			se, own := res.find(stratSerial, m), res.find(stratBackground, m)
			what := "torn down before binding"
			if own.measured() {
				what = fmt.Sprintf("%.0f× slower than phasegate's %s", se.ServingMs.Median/own.ServingMs.Median, fmtMs(own.ServingMs.Median))
			}
			if x := res.find(stratSerial, n); m < n && x != nil && x.Extrapolated != nil {
				what += fmt.Sprintf("; ~%s at %s (extrapolated)", fmtMs(x.Extrapolated.ServingMs), thousands(n))
			}
			fmt.Fprintf(&b, "| %s leaked, reclaimed one by one before binding (the E2B orchestrator's start) | %s | %s | %s |\n",
				thousands(m), fmtMs(se.FirstAnswerMs.Median), fmtMs(se.ServingMs.Median), what)
		}
	}
	for _, v := range []struct {
		what       string
		term, kill string
	}{
		{"leased slots (SIGTERM or kill -9)", stratRestoreTerm, stratRestoreKill},
		{"leased microVM-ready slots with an egress policy each (SIGTERM or kill -9)", stratGuestTerm, stratGuestKill},
	} {
		n := min(largestN(res, v.term), largestN(res, v.kill))
		if n == 0 {
			continue
		}
		ps := []*Point{res.find(v.term, n), res.find(v.kill, n)}
		restored, destroyed := n, 0
		for _, p := range ps {
			w := worstRestore(p)
			restored, destroyed = min(restored, w.Restored), max(destroyed, w.Destroyed)
		}
		fmt.Fprintf(&b, "| %s %s | %s | %s | %s/%s restored to their owners (verified by %s after exec), %d destroyed |\n",
			thousands(n), v.what, spanOf(ps, func(p *Point) Summary { return p.FirstAnswerMs }), spanOf(ps, func(p *Point) Summary { return p.ServingMs }),
			thousands(restored), thousands(n), spanOf(ps, func(p *Point) Summary { return p.VerifiedMs }), destroyed)
		rows++
	}
	if rows == 0 {
		return "", errNoHeadline
	}
	if u := res.Upgrade; u != nil {
		b.WriteString("\n" + upgradeSentence(u) + "\n")
	}
	return b.String(), nil
}

// upgradeSentence says what the probes got across the upgrade part's
// scenarios.
func upgradeSentence(u *UpgradeResult) string {
	var parts []string
	for _, sc := range u.Scenarios {
		switch sc.Name {
		case scenUpgrade:
			parts = append(parts, fmt.Sprintf("Across %d in-place upgrades (SIGHUP) under %d new connections/s: **%d refused, %d failed**, the fewest leases kept %d of %d.",
				sc.Events, u.Rate, sc.Refused, sc.Failed, sc.Restored, u.Leases))
		case scenRestart:
			parts = append(parts, fmt.Sprintf("A stop and start with the port closed between them refused %s of %s;", thousands(sc.Refused), thousands(sc.Probes)))
		case scenRestartFDs:
			parts = append(parts, fmt.Sprintf("with the socket held by systemd (socket activation), %s.", thousands(sc.Refused)))
		}
	}
	return strings.Join(parts, " ")
}

// largestN is the largest N > 0 at which strategy was measured, or 0.
func largestN(res *Results, strategy string) int {
	n := 0
	for _, p := range res.Points {
		if p.Strategy == strategy && p.N > n && p.measured() {
			n = p.N
		}
	}
	return n
}

// spanOf formats the medians of f over ps as one figure, or as "a–b"
// when they differ once formatted.
func spanOf(ps []*Point, f func(*Point) Summary) string {
	var ms []float64
	for _, p := range ps {
		if s := f(p); s.Count > 0 {
			ms = append(ms, s.Median)
		}
	}
	if len(ms) == 0 {
		return "—"
	}
	lo, hi := fmtMs(slices.Min(ms)), fmtMs(slices.Max(ms))
	if lo == hi {
		return lo
	}
	if n, unit, ok := strings.Cut(lo, " "); ok && strings.HasSuffix(hi, " "+unit) {
		return n + "–" + hi // 137–138 ms
	}
	return lo + "–" + hi
}

// thousands formats n with thousands separators, as the README's prose does.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
