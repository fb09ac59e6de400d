package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/phasegate/phasegate/network/slot"
)

// goalSlotRateVsLibrary is the goal of Acquires beyond the warm pool: their
// rate over the rate at which the library makes slots alone, same run.
const goalSlotRateVsLibrary = 0.8

// slotRateCallers are the concurrencies of the daemon's side.
var slotRateCallers = []int{1, 16}

// slotRateOwner owns the slots the slotrate part leases.
const slotRateOwner = "bench-slotrate"

// SlotRateResult compares slots made beyond the warm pool by the daemon
// (Acquire with --pool-size 1) with slots made by the library alone
// (slot.Manager.Create, one after the other, no daemon), each rep measuring
// every side in turn.
type SlotRateResult struct {
	Slots int `json:"slotsPerRun"`
	Reps  int `json:"reps"`
	// Library is slot.Manager.Create in this process, after a Survey (as
	// the daemon's start does), slots/s by rep.
	Library []float64 `json:"libraryPerS"`
	// Daemon are the Acquire bursts, by number of callers.
	Daemon []SlotRateSide `json:"daemon"`
}

// SlotRateSide is the daemon's Acquire bursts beyond the pool from one
// number of concurrent callers.
type SlotRateSide struct {
	Callers int          `json:"callers"`
	PerS    []float64    `json:"callsPerS"`
	Latency LatencyStats `json:"latency"`
}

// measureSlotRate runs the slotrate part: each rep makes -slotrate-n slots
// with the library alone, then leases -slotrate-n slots from a daemon whose
// warm pool is one slot, from 1 and from 16 callers (a fresh daemon each,
// removed after), the order of the sides turning from rep to rep.
func (r *runner) measureSlotRate(ctx context.Context) error {
	n := r.o.slotRateN
	res := &SlotRateResult{Slots: n, Reps: r.o.reps}
	lat := map[int][]sample{}
	for _, c := range slotRateCallers {
		res.Daemon = append(res.Daemon, SlotRateSide{Callers: c})
	}
	sides := append([]int{0}, slotRateCallers...) // 0: the library alone
	for rep := range r.o.reps {
		order := slices.Clone(sides)
		for range rep % len(order) {
			order = append(order[1:], order[0])
		}
		for _, callers := range order {
			r.sampleLoad()
			if callers == 0 {
				perS, err := r.libraryRate(ctx, n)
				if err != nil {
					return fmt.Errorf("library: %w", err)
				}
				res.Library = append(res.Library, perS)
				r.logf("slotrate rep %d library alone: %d slots, %.0f/s", rep+1, n, perS)
				continue
			}
			perS, s, err := r.daemonSlotRate(ctx, n, callers, rep)
			if err != nil {
				return fmt.Errorf("daemon, %d callers: %w", callers, err)
			}
			k := slices.Index(slotRateCallers, callers)
			res.Daemon[k].PerS = append(res.Daemon[k].PerS, perS)
			lat[callers] = append(lat[callers], s...)
			r.logf("slotrate rep %d daemon, %d callers: %d Acquires beyond the pool, %.0f/s", rep+1, callers, n, perS)
		}
	}
	for k := range res.Daemon {
		res.Daemon[k].Latency = latencyOf(lat[res.Daemon[k].Callers])
	}
	r.res.SlotRate = res
	return nil
}

// libraryRate makes slots 1..n with a slot.Manager of the benchmark's
// configuration, one after the other, and removes them.
func (r *runner) libraryRate(ctx context.Context, n int) (float64, error) {
	m, err := slot.NewManager(ctx, r.h.cfg, slot.DefaultOptions())
	if err != nil {
		return 0, err
	}
	if _, err := m.Survey(ctx); err != nil {
		return 0, err
	}
	t0 := time.Now()
	var made []int
	for i := 1; i <= n; i++ {
		if _, err = m.Create(ctx, i); err != nil {
			break
		}
		made = append(made, i)
	}
	took := time.Since(t0)
	tr := m.Teardown(ctx, slot.Assume(made...), slot.TeardownOptions{Workers: r.o.workers})
	if err != nil {
		return 0, err
	}
	if err := tr.Err(); err != nil {
		return 0, err
	}
	return float64(n) / took.Seconds(), r.reset(ctx)
}

// daemonSlotRate starts the daemon with a warm pool of one slot, leases n
// slots from callers concurrent callers, stops it and removes every slot.
func (r *runner) daemonSlotRate(ctx context.Context, n, callers, rep int) (float64, []sample, error) {
	addr, err := freeAddr()
	if err != nil {
		return 0, nil, err
	}
	d, _, _, err := r.startServing(ctx, daemonArgs(r.h, addr, r.o, modeBackground, 1), nil, startTimeout(0, modeBackground))
	if err != nil {
		return 0, nil, err
	}
	b, err := acquireBurst(ctx, d.slotsTarget(), n, callers, slotRateOwner, fmt.Sprintf("slotrate-%d-%d", callers, rep), 0, nil)
	if err != nil {
		d.kill()
		return 0, nil, err
	}
	if _, err := d.stop(); err != nil {
		return 0, nil, err
	}
	samples := make([]sample, 0, n)
	for _, l := range b.lat {
		samples = append(samples, sample{Kind: kindAcquire, Latency: int64(l)})
	}
	for range b.errors {
		samples = append(samples, sample{Kind: kindAcquire, Err: b.firstErr})
	}
	return float64(len(b.lat)) / b.elapsed.Seconds(), samples, r.reset(ctx)
}

// slotRateGoal is Acquires beyond the warm pool against the library alone,
// for each number of callers.
func slotRateGoal(r *Results) Goal {
	g := Goal{Name: "Acquires beyond the warm pool vs the library making slots alone, 1 and 16 callers",
		Target: fmt.Sprintf("≥ %.1f× each", goalSlotRateVsLibrary)}
	s := r.SlotRate
	if s == nil || len(s.Library) == 0 {
		g.Status, g.Note = goalNotMeasured, fmt.Sprintf(noteNotMeasuredInPart, partSlotRate)
		return g
	}
	lib := summarize(s.Library).Median
	var (
		parts  []string
		misses []string
	)
	for _, d := range s.Daemon {
		got := summarize(d.PerS).Median
		ratio := got / lib
		parts = append(parts, fmt.Sprintf("%d callers %.2f× (%.0f/s)", d.Callers, ratio, got))
		if d.Latency.Errors > 0 {
			misses = append(misses, fmt.Sprintf("%d errors with %d callers", d.Latency.Errors, d.Callers))
		}
		if ratio < goalSlotRateVsLibrary {
			misses = append(misses, fmt.Sprintf("%d callers short by %.2f×", d.Callers, goalSlotRateVsLibrary-ratio))
		}
	}
	g.Measured = fmt.Sprintf("%s, library alone %.0f/s (medians of %d reps of %d slots)", strings.Join(parts, ", "), lib, s.Reps, s.Slots)
	verdict(&g, true, misses)
	return g
}

// printSlotRate writes the part's figures to the table on stdout.
func printSlotRate(w io.Writer, s *SlotRateResult) {
	fmt.Fprintf(w, "\nslots beyond the warm pool, %d per run, %d reps:\n", s.Slots, s.Reps)
	fmt.Fprintf(w, "  library alone  %s slots/s\n", fmtRate(summarize(s.Library)))
	for _, d := range s.Daemon {
		fmt.Fprintf(w, "  daemon, %2d callers  %s Acquires/s, p50 %s, p99 %s, %d errors\n", d.Callers, fmtRate(summarize(d.PerS)),
			fmtMs(d.Latency.P50Ms), fmtMs(d.Latency.P99Ms), d.Latency.Errors)
	}
}

// markdownSlotRate writes the part's section of report.md.
func markdownSlotRate(b *bytes.Buffer, s *SlotRateResult) {
	b.WriteString("### Slots made beyond the warm pool: the daemon vs the library alone\n\n")
	fmt.Fprintf(b, "*library alone*: `slot.Manager.Create` of slots 1..%d one after the other in the benchmark's process, after a "+
		"`Survey` (as the daemon's start does), no daemon running. *daemon*: `phasegate serve --pool-size 1`, then %d `Acquire` "+
		"calls (own request id each, lease recorded before the reply) from 1 and from 16 concurrent callers on one connection, "+
		"so that every call but the first waits for a slot to be made (on demand or by the pool's refill). A fresh daemon each "+
		"burst, everything removed after; %d reps, the order of the sides turning.\n\n", s.Slots, s.Slots, s.Reps)
	b.WriteString("| side | slots/s (median [min–max] over reps) | vs library | Acquire p50 | p99 | errors |\n|---|---:|---:|---:|---:|---:|\n")
	lib := summarize(s.Library)
	fmt.Fprintf(b, "| library alone | %s | 1 | — | — | — |\n", fmtRate(lib))
	for _, d := range s.Daemon {
		got := summarize(d.PerS)
		fmt.Fprintf(b, "| daemon, %d callers | %s | %.2f× | %s | %s | %d |\n", d.Callers, fmtRate(got), got.Median/lib.Median,
			fmtMs(d.Latency.P50Ms), fmtMs(d.Latency.P99Ms), d.Latency.Errors)
	}
	b.WriteString("\n")
}
