package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
)

// TestABFigures checks the ab part's arithmetic: each side's figures from
// its own runs only, the ratio B/A of its medians, the spread of that
// ratio over the rounds (each round's B against that round's A), the
// daemon's CPU per check, and the port's refusals summed by reason.
func TestABFigures(t *testing.T) {
	win := func(rep, side int, p99, cpu float64, refused map[string]int) ABWindow {
		return ABWindow{Rep: rep, Side: side, Rate: 500, CPUMs: cpu, Refused: refused, Checks: map[string]LatencyStats{
			kindGRPC: {Requests: 50, P99Ms: p99}, kindHTTP: {Requests: 50, P99Ms: p99},
		}}
	}
	ab := &ABResult{Sides: [2]string{"old", "new"}, Reps: 2, Starts: 2, Rates: []int{500}, WindowMs: 100, SlotMs: 25}
	ab.Runs = []ABRun{
		{Rep: 0, Side: sideA, FirstAnswerMs: 10},
		{Rep: 0, Side: sideB, FirstAnswerMs: 12},
		{Rep: 0, Side: sideA, FirstAnswerMs: 20},
		{Rep: 0, Side: sideB, FirstAnswerMs: 18},
		{Rep: 1, Side: sideB, FirstAnswerMs: 30},
		{Rep: 1, Side: sideA, FirstAnswerMs: 20},
		{Rep: 1, Side: sideB, FirstAnswerMs: 30},
		{Rep: 1, Side: sideA, FirstAnswerMs: 20},
		// Another mode's start is none of plain's figures.
		{Rep: 1, Side: sideB, TLS: true, FirstAnswerMs: 1000},
	}
	ab.Windows = []ABWindow{
		win(0, sideA, 2, 50, nil), win(0, sideB, 3, 60, map[string]int{"sniffing": 2}),
		win(1, sideB, 4, 60, map[string]int{"sniffing": 1}), win(1, sideA, 4, 50, nil),
	}
	tlsWin := win(1, sideB, 1000, 1000, map[string]int{"total": 9})
	tlsWin.TLS = true
	ab.Windows = append(ab.Windows, tlsWin)
	ab.Checks = []ABChecks{{Rate: 500, Kind: kindGRPC, Side: [2]LatencyStats{{Requests: 100, P99Ms: 4}, {Requests: 100, P99Ms: 4}}}}

	f := abStartFigures[0]
	a, aRep := ab.abStarts(sideA, false, f)
	b, bRep := ab.abStarts(sideB, false, f)
	if sa, sb := summarize(a), summarize(b); sa.Median != 20 || sb.Median != 24 || sa.Count != 4 || sb.Count != 4 {
		t.Errorf("first answers: A %+v, B %+v; want medians 20 and 24 of 4 starts each", sa, sb)
	}
	// Round 1: medians 15 and 15 (1.00); round 2: 20 and 30 (1.50).
	if r := perRoundRatio(aRep, bRep); fmtRatioSummary(r) != "1.25 [1.00–1.50]" {
		t.Errorf("first answer per round = %s, want 1.25 [1.00–1.50]", fmtRatioSummary(r))
	}
	// p99 round 1: 2 and 3 (1.50); round 2: 4 and 4 (1.00).
	if r := perRoundRatio(ab.abP99s(sideA, false, 500, kindGRPC), ab.abP99s(sideB, false, 500, kindGRPC)); fmtRatioSummary(r) != "1.25 [1.00–1.50]" {
		t.Errorf("p99 per round = %s, want 1.25 [1.00–1.50]", fmtRatioSummary(r))
	}
	if a, b := ab.abCPUPerCheck(sideA, false, 500), ab.abCPUPerCheck(sideB, false, 500); a != 500 || b != 600 {
		t.Errorf("CPU per check = %v µs and %v µs, want 500 and 600", a, b)
	}
	if a, b := ab.abRefused(sideA, false, 500), ab.abRefused(sideB, false, 500); a != "0" || b != "sniffing 3" {
		t.Errorf("refused = %q and %q, want 0 and sniffing 3", a, b)
	}
	var md bytes.Buffer
	markdownAB(&md, ab)
	for _, want := range []string{"A: `old` (`-ab-binary`), B: `new`", "| first HTTP answer | plain | 20.0 ms [10.0 ms–20.0 ms] | 24.0 ms [12.0 ms–30.0 ms] | 1.20 | 1.25 [1.00–1.50] |",
		"| plain | 500 | 500 µs | 600 µs | 1.20 | 0 | sniffing 3 |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	if strings.Contains(md.String(), "TLS") {
		t.Errorf("markdown of a plain-only run mentions TLS:\n%s", md.String())
	}
}

// TestABOptions: part ab runs only when named, and its rates are checked.
func TestABOptions(t *testing.T) {
	for _, tt := range []struct {
		args     []string
		ab       bool
		rates    string
		tlsRates string
		err      bool
	}{
		{nil, false, "[500 1000 2000]", "[500]", false},
		{[]string{"-parts", "ab"}, true, "[500 1000 2000]", "[500]", false},
		{[]string{"-parts", "ab", "-ab-rates", "100", "-ab-tls-rates", "50,60"}, true, "[100]", "[50 60]", false},
		{[]string{"-parts", "ab", "-ab-rates", "100,x"}, true, "", "", true},
		{[]string{"-parts", "ab", "-ab-tls-rates", "9000"}, true, "", "", true},
		{[]string{"-parts", "ab", "-ab-reps", "0"}, true, "", "", true},
		{[]string{"-parts", "ab", "-ab-window", "0s"}, true, "", "", true},
		{[]string{"-parts", "ab", "-ab-window", "3s"}, true, "", "", true},
		{[]string{"-parts", "ab", "-ab-window", "1s", "-ab-slot", "250ms"}, true, "[500 1000 2000]", "[500]", false},
	} {
		o, err := parseOptions(tt.args, io.Discard)
		if (err != nil) != tt.err {
			t.Errorf("%q: error %v, want one: %v", tt.args, err, tt.err)
			continue
		}
		if err != nil {
			continue
		}
		if o.has(partAB) != tt.ab || fmt.Sprint(o.ab.rates) != tt.rates || fmt.Sprint(o.ab.tlsRates) != tt.tlsRates {
			t.Errorf("%q: ab %v, rates %v, TLS rates %v; want %v, %s, %s", tt.args, o.has(partAB), o.ab.rates, o.ab.tlsRates, tt.ab, tt.rates, tt.tlsRates)
		}
	}
}
