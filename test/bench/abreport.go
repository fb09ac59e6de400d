package main

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// The ab part's figures, as rendered: each side's, their ratio B/A, and
// the spread of that ratio over the rounds, which is what says whether a
// difference is more than the machine's noise.

// abStartFigure is one time of a start, from its exec.
type abStartFigure struct {
	name string
	pick func(ABRun) float64
}

var abStartFigures = []abStartFigure{
	{"first HTTP answer", func(r ABRun) float64 { return r.FirstAnswerMs }},
	{"first gRPC answer (Watch)", func(r ABRun) float64 { return r.FirstGRPCMs }},
	{"SERVING", func(r ABRun) float64 { return r.ServingMs }},
}

// abStarts returns a start figure of side's runs in mode, all of them and
// by round.
func (ab *ABResult) abStarts(side int, tls bool, f abStartFigure) (all []float64, byRep map[int][]float64) {
	byRep = map[int][]float64{}
	for _, r := range ab.Runs {
		if r.Side == side && r.TLS == tls {
			all = append(all, f.pick(r))
			byRep[r.Rep] = append(byRep[r.Rep], f.pick(r))
		}
	}
	return all, byRep
}

// perRoundRatio is, for each round in which both sides have values, B's
// median over A's.
func perRoundRatio(a, b map[int][]float64) Summary {
	var ratios []float64
	for rep, av := range a {
		bv, ok := b[rep]
		if !ok || len(av) == 0 || len(bv) == 0 {
			continue
		}
		if m := summarize(av).Median; m > 0 {
			ratios = append(ratios, summarize(bv).Median/m)
		}
	}
	return summarize(ratios)
}

// abWindowsOf calls f with each of side's windows at rate in mode.
func (ab *ABResult) abWindowsOf(side int, tls bool, rate int, f func(ABWindow)) {
	for _, w := range ab.Windows {
		if w.Side == side && w.TLS == tls && w.Rate == rate {
			f(w)
		}
	}
}

// abP99s returns side's p99 of kind at rate in mode, round by round.
func (ab *ABResult) abP99s(side int, tls bool, rate int, kind string) map[int][]float64 {
	out := map[int][]float64{}
	ab.abWindowsOf(side, tls, rate, func(w ABWindow) {
		if st, ok := w.Checks[kind]; ok {
			out[w.Rep] = append(out[w.Rep], st.P99Ms)
		}
	})
	return out
}

// abCPUPerCheck is side's daemon CPU per check at rate in mode, in µs:
// its time over all its windows by the checks sent to it in them.
func (ab *ABResult) abCPUPerCheck(side int, tls bool, rate int) float64 {
	var cpu float64
	var n int
	ab.abWindowsOf(side, tls, rate, func(w ABWindow) {
		cpu += w.CPUMs
		n += w.Checks[kindGRPC].Requests + w.Checks[kindHTTP].Requests
	})
	if n == 0 {
		return 0
	}
	return 1000 * cpu / float64(n)
}

// abRefused sums side's refusals by the port at rate in mode, by reason:
// "sniffing 12, total 3", or "0".
func (ab *ABResult) abRefused(side int, tls bool, rate int) string {
	sum := map[string]int{}
	ab.abWindowsOf(side, tls, rate, func(w ABWindow) {
		for reason, n := range w.Refused {
			sum[reason] += n
		}
	})
	if len(sum) == 0 {
		return "0"
	}
	var parts []string
	for _, reason := range slices.Sorted(maps.Keys(sum)) {
		parts = append(parts, fmt.Sprintf("%s %d", reason, sum[reason]))
	}
	return strings.Join(parts, ", ")
}

// ratesOf are the rates of a mode's windows.
func (ab *ABResult) ratesOf(tls bool) []int {
	if tls {
		return ab.TLSRates
	}
	return ab.Rates
}

// flat joins a round-by-round map's values.
func flat(m map[int][]float64) []float64 {
	var out []float64
	for _, v := range m {
		out = append(out, v...)
	}
	return out
}

// modeName names the way the port was served.
func modeName(tls bool) string {
	if tls {
		return "TLS"
	}
	return "plain"
}

// fmtRatio formats a ratio, or "—" for none.
func fmtRatio(v float64) string {
	if v == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", v)
}

// fmtRatioSummary formats a summary of ratios as "median [min–max]".
func fmtRatioSummary(s Summary) string {
	if s.Count == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f [%.2f–%.2f]", s.Median, s.Min, s.Max)
}

// ratio is b/a, or 0 when a is 0.
func ratio(a, b float64) float64 {
	if a == 0 {
		return 0
	}
	return b / a
}

func markdownAB(b *bytes.Buffer, ab *ABResult) {
	b.WriteString("### Two builds side by side: the first answer and health checks on new connections (part ab)\n\n")
	modes, handshake := "plain", ""
	if ab.TLS {
		modes, handshake = "plain and with TLS (`--tls-cert`, a self-signed ECDSA P-256 certificate)", " (with TLS a full handshake each, no session resumption)"
	}
	rates := joinInts(ab.Rates, ", ") + " checks/s"
	if ab.TLS {
		rates += " (with TLS " + joinInts(ab.TLSRates, ", ") + ")"
	}
	fmt.Fprintf(b, "A: `%s` (`-ab-binary`), B: `%s` (`-binary`), each with a prefix, directories and a slot range of its own. "+
		"%d rounds. In each, each side is started %d times %s, the sides taking turns start by start and the first side "+
		"changing from round to round (AB, BA, …); every start is timed from its exec: the benchmark's pollers start as the exec "+
		"returns, HTTP `GET /health` on a new connection every millisecond and a gRPC health `Watch`. Then, in each mode, a daemon "+
		"of each side is started and, once both warm pools are full, both take the checks of one load-generator process at "+
		"%s: a new TCP connection each%s, alternately HTTP `GET /health` and gRPC `Check`, open loop, 2 s timeout, "+
		"sent to one daemon for %s, then to the other, in ABBA order, for %s at each rate; a side's figures are from its slots "+
		"(the rate is what a daemon gets in its slots). Ratios are B/A; *per round* is the spread of that ratio over the rounds, "+
		"each round's B against its A.\n\n",
		ab.Sides[sideA], ab.Sides[sideB], ab.Reps, ab.Starts, modes, rates, handshake, fmtMs(ab.SlotMs), fmtMs(ab.WindowMs))
	b.WriteString("| from the exec | mode | A: median [min–max] | B: median [min–max] | B/A, medians | B/A per round |\n|---|---|---:|---:|---:|---:|\n")
	for _, f := range abStartFigures {
		for _, tls := range abModes(ab) {
			a, aRep := ab.abStarts(sideA, tls, f)
			bb, bRep := ab.abStarts(sideB, tls, f)
			sa, sb := summarize(a), summarize(bb)
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s |\n", f.name, modeName(tls), fmtSummary(sa), fmtSummary(sb),
				fmtRatio(ratio(sa.Median, sb.Median)), fmtRatioSummary(perRoundRatio(aRep, bRep)))
		}
	}
	b.WriteString("\n| checks | rate/s | kind | requests A, B | errors A, B | A: p50, p99, max | B: p50, p99, max | B/A p99 | " +
		"p99 per round, A: median [min–max] | B | B/A p99 per round |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range ab.Checks {
		a, bs := c.Side[sideA], c.Side[sideB]
		aRep, bRep := ab.abP99s(sideA, c.TLS, c.Rate, c.Kind), ab.abP99s(sideB, c.TLS, c.Rate, c.Kind)
		fmt.Fprintf(b, "| %s | %d | %s | %d, %d | %d, %d | %s, %s, %s | %s, %s, %s | %s | %s | %s | %s |\n",
			modeName(c.TLS), c.Rate, c.Kind, a.Requests, bs.Requests, a.Errors, bs.Errors,
			fmtMs(a.P50Ms), fmtMs(a.P99Ms), fmtMs(a.MaxMs), fmtMs(bs.P50Ms), fmtMs(bs.P99Ms), fmtMs(bs.MaxMs),
			fmtRatio(ratio(a.P99Ms, bs.P99Ms)), fmtSummary(summarize(flat(aRep))), fmtSummary(summarize(flat(bRep))),
			fmtRatioSummary(perRoundRatio(aRep, bRep)))
	}
	b.WriteString("\n| windows | rate/s | the daemon's CPU per check, A | B | B/A | connections the port refused (`phasegate_conns_refused_total`), A | B |\n" +
		"|---|---:|---:|---:|---:|---|---|\n")
	for _, tls := range abModes(ab) {
		for _, rate := range ab.ratesOf(tls) {
			a, bs := ab.abCPUPerCheck(sideA, tls, rate), ab.abCPUPerCheck(sideB, tls, rate)
			fmt.Fprintf(b, "| %s | %d | %.0f µs | %.0f µs | %s | %s | %s |\n", modeName(tls), rate, a, bs, fmtRatio(ratio(a, bs)),
				ab.abRefused(sideA, tls, rate), ab.abRefused(sideB, tls, rate))
		}
	}
	b.WriteString("\n")
}

// printAB writes the ab part's summary.
func printAB(w io.Writer, ab *ABResult) {
	fmt.Fprintf(w, "\nA %s beside B %s, %d rounds (B/A; per round: median [min–max]):\n", ab.Sides[sideA], ab.Sides[sideB], ab.Reps)
	for _, tls := range abModes(ab) {
		f := abStartFigures[0]
		a, aRep := ab.abStarts(sideA, tls, f)
		bb, bRep := ab.abStarts(sideB, tls, f)
		sa, sb := summarize(a), summarize(bb)
		fmt.Fprintf(w, "  %-5s first answer  A %s, B %s; B/A %s, per round %s\n", modeName(tls), fmtSummary(sa), fmtSummary(sb),
			fmtRatio(ratio(sa.Median, sb.Median)), fmtRatioSummary(perRoundRatio(aRep, bRep)))
	}
	for _, c := range ab.Checks {
		a, b := c.Side[sideA], c.Side[sideB]
		fmt.Fprintf(w, "  %-5s %4d/s %-4s p99 A %s, B %s; B/A %s, per round %s; errors %d, %d; refused by the port %s, %s\n", modeName(c.TLS), c.Rate, c.Kind,
			fmtMs(a.P99Ms), fmtMs(b.P99Ms), fmtRatio(ratio(a.P99Ms, b.P99Ms)),
			fmtRatioSummary(perRoundRatio(ab.abP99s(sideA, c.TLS, c.Rate, c.Kind), ab.abP99s(sideB, c.TLS, c.Rate, c.Kind))), a.Errors, b.Errors,
			ab.abRefused(sideA, c.TLS, c.Rate), ab.abRefused(sideB, c.TLS, c.Rate))
	}
}

// abModes are the modes the part ran.
func abModes(ab *ABResult) []bool {
	return abOptions{tls: ab.TLS}.modes()
}

// joinInts joins numbers with sep.
func joinInts(xs []int, sep string) string {
	parts := make([]string, 0, len(xs))
	for _, x := range xs {
		parts = append(parts, fmt.Sprintf("%d", x))
	}
	return strings.Join(parts, sep)
}
