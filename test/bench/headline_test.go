package main

import (
	"errors"
	"strings"
	"testing"
)

// headlineResults are results of every part made by hand: the dead
// strategies at 1,000 and 10,000 (the serial baseline extrapolated at
// 10,000), both restarts, and the upgrade scenarios.
func headlineResults() *Results {
	res := &Results{Machine: Machine{NumCPU: 2}}
	add := func(s string, n int, runs ...Run) { res.point(s, n).Runs = runs }
	add(stratBackground, 1000, Run{FirstAnswerMs: 10, ServingMs: 50, DeadGoneMs: 250})
	add(stratBackground, 10000, Run{FirstAnswerMs: 20, ServingMs: 130, DeadGoneMs: 4130})
	add(stratFloor, 10000, Run{ServingMs: 4000})
	add(stratForeground, 10000, Run{FirstAnswerMs: 40, ServingMs: 5600})
	add(stratSerial, 1000, Run{FirstAnswerMs: 35000, ServingMs: 35000})
	res.point(stratSerial, 10000).Extrapolated = &Extrapolation{ServingMs: 354000}
	add(stratRestoreTerm, 10000, Run{FirstAnswerMs: 28, ServingMs: 137, VerifiedMs: 417, Restored: 10000})
	add(stratRestoreKill, 10000, Run{FirstAnswerMs: 29, ServingMs: 138, VerifiedMs: 427, Restored: 9999, Destroyed: 1})
	res.Upgrade = &UpgradeResult{Rate: 500, Leases: 64, Scenarios: []Scenario{
		{Name: scenUpgrade, Events: 20, Refused: 0, Failed: 1, Restored: 64},
		{Name: scenRestart, Probes: 1321, Refused: 19},
		{Name: scenRestartFDs, Refused: 0},
	}}
	res.evaluate()
	return res
}

// TestHeadline renders the README's table from results made by hand: the
// rows at the largest N measured, each figure from its point, and the
// rows of parts not run left out.
func TestHeadline(t *testing.T) {
	for _, tc := range []struct {
		name    string
		res     func() *Results
		want    []string
		notWant []string
		err     error
	}{
		{
			name: "every part",
			res:  headlineResults,
			want: []string{
				"Measured on a 2-core machine",
				"| 10,000 leaked (dead) slots | 20.0 ms | 130 ms | torn down in the background: 4.00 s after SERVING, 1.00× the kernel's own floor (4.00 s) |",
				"| the same with `--reclaim=foreground` (the start before live restore) | 40.0 ms | 5.60 s | torn down before serving |",
				"| 1,000 leaked, reclaimed one by one before binding (the E2B orchestrator's start) | 35.0 s | 35.0 s | 700× slower than phasegate's 50.0 ms; ~5.9 min at 10,000 (extrapolated) |",
				// the worst of the two restarts: the fewest restored, the most destroyed
				"| 10,000 leased slots (SIGTERM or kill -9) | 28.0–29.0 ms | 137–138 ms | 9,999/10,000 restored to their owners (verified by 417–427 ms after exec), 1 destroyed |",
				"Across 20 in-place upgrades (SIGHUP) under 500 new connections/s: **0 refused, 1 failed**, the fewest leases kept 64 of 64. " +
					"A stop and start with the port closed between them refused 19 of 1,321; with the socket held by systemd (socket activation), 0.",
			},
			notWant: []string{"microVM-ready"},
		},
		{
			name: "restore only",
			res: func() *Results {
				res := &Results{Machine: Machine{NumCPU: 2}}
				res.point(stratRestoreTerm, 1000).Runs = []Run{{FirstAnswerMs: 9, ServingMs: 40, VerifiedMs: 60, Restored: 1000}}
				res.point(stratRestoreKill, 1000).Runs = []Run{{FirstAnswerMs: 9, ServingMs: 40, VerifiedMs: 60, Restored: 1000}}
				res.evaluate()
				return res
			},
			want:    []string{"| 1,000 leased slots (SIGTERM or kill -9) | 9.00 ms | 40.0 ms | 1,000/1,000 restored to their owners (verified by 60.0 ms after exec), 0 destroyed |"},
			notWant: []string{"leaked", "upgrades"},
		},
		{
			name: "nothing at N > 0",
			res: func() *Results {
				res := &Results{}
				res.point(stratBackground, 0).Runs = []Run{{ServingMs: 20}}
				res.evaluate()
				return res
			},
			err: errNoHeadline,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := headline(tc.res())
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("missing %q in:\n%s", w, got)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(got, w) {
					t.Errorf("%q in:\n%s", w, got)
				}
			}
		})
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 10000: "10,000", 1234567: "1,234,567", -1000: "-1,000"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}
