package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/phasegate/phasegate/network/shape"
)

// measureDecom times `phasegate decommission --destroy-leased-slots` of N
// leased slots beside the kernel floor for the same namespaces and links,
// at each N of -n above 0, -reps times, interleaved: each run leases N
// slots through the API (the plain restore variant), stops the daemon, and
// removes them one way. The floor unlinks the netns files with -workers
// workers, waits until every host link of the prefix is gone and deletes
// the table (timed apart); decommission is its exec to its exit. With
// -ab-binary that build's decommission is timed too, on leases this
// build's daemon made, the two builds taking turns going first. The figures go to the log and stdout as a table.
func (r *runner) measureDecom(ctx context.Context) error {
	bins := []string{r.bin}
	if r.o.ab.binary != "" {
		bins = append(bins, r.o.ab.binary)
	}
	var rows []decomRow
	for _, n := range r.o.ns {
		if n == 0 {
			continue
		}
		for _, v := range r.restoreVariants() {
			row, err := r.decomN(ctx, n, v, bins)
			if err != nil {
				return fmt.Errorf("N=%d %s: %w", n, v.name(), err)
			}
			rows = append(rows, row)
		}
	}
	r.logf("decommission of N leased slots beside the kernel floor, median [min–max] of %d:\n%s", r.o.reps, decomTable(rows, bins))
	return nil
}

// decomN measures one N and variant -reps times: the floor, then each
// binary's decommission, each on a fleet leased for it.
func (r *runner) decomN(ctx context.Context, n int, v restoreVariant, bins []string) (decomRow, error) {
	row := decomRow{n: n, variant: v.name(), decom: make([][]time.Duration, len(bins))}
	for rep := range r.o.reps {
		f, fw, err := r.decomFloor(ctx, n, v)
		if err != nil {
			return row, fmt.Errorf("floor: %w", err)
		}
		row.floor = append(row.floor, f)
		r.sampleLoad()
		r.logf("N=%d %s rep %d: kernel floor %s (table delete after it %s), load average %.2f", n, v.name(), rep+1, fmtMs(ms(f)), fmtMs(ms(fw)), loadAvg())
		// The builds take turns going first: a run right after another
		// meets the kernel still freeing what that one left.
		for j := range bins {
			k := (j + rep) % len(bins)
			bin := bins[k]
			took, last, err := r.decomRun(ctx, n, v, bin)
			if err != nil {
				return row, fmt.Errorf("decommission by %s: %w", bin, err)
			}
			row.decom[k] = append(row.decom[k], took)
			r.sampleLoad()
			r.logf("N=%d %s rep %d: %s decommission %s (%.2f× the floor), load average %.2f: %s", n, v.name(), rep+1, bin, fmtMs(ms(took)), took.Seconds()/f.Seconds(), loadAvg(), last)
		}
	}
	return row, nil
}

// decomRow is one N and variant's runs: the floor's and each binary's
// decommission's.
type decomRow struct {
	n       int
	variant string
	floor   []time.Duration
	decom   [][]time.Duration
}

// leaseStopped leases n slots through a daemon of this build (its warm
// pool full again), as the restore part's variant v does, and stops it:
// what a host leaving service holds.
func (r *runner) leaseStopped(ctx context.Context, n int, v restoreVariant) error {
	f, err := r.leaseRestoreFleet(ctx, n, v)
	if err != nil {
		return err
	}
	_, err = f.d.stop()
	return err
}

// decomFloor leases n slots, stops the daemon and removes its slots by
// the kernel floor: every netns file of the prefix detached and unlinked,
// the ifbs of the leases' limits deleted in one go, then the wait until
// every host link of the prefix is gone (took); the
// table's deletion after it is timed apart (fw). The records left are
// then removed by a decommission that finds nothing else.
func (r *runner) decomFloor(ctx context.Context, n int, v restoreVariant) (took, fw time.Duration, err error) {
	if err := r.leaseStopped(ctx, n, v); err != nil {
		return 0, 0, err
	}
	links, err := r.h.hostLinkIndices()
	if err != nil {
		return 0, 0, err
	}
	if len(links) < n {
		return 0, 0, fmt.Errorf("%d host links, want at least %d", len(links), n)
	}
	ifbs, err := r.h.linksNamed(r.h.cfg.ShaperIfPrefix())
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	if err := unlinkNetns(r.h, r.o.workers); err != nil {
		return 0, 0, err
	}
	if err := deleteIfbsFloor(ifbs); err != nil {
		return 0, 0, err
	}
	if err := waitLinksGone(ctx, links, 10*time.Minute); err != nil {
		return 0, 0, err
	}
	took = time.Since(t0)
	t1 := time.Now()
	if err := r.h.dropTable(ctx); err != nil {
		return 0, 0, err
	}
	fw = time.Since(t1)
	return took, fw, r.reset(ctx)
}

// deleteIfbsFloor deletes the ifbs of leases with limits the kernel's
// cheapest way: all of them in one link group, deleted in one
// RTM_DELLINK (shape.DeleteIfbs), whose RCU grace periods the kernel
// pays once rather than once a device.
func deleteIfbsFloor(ifbs []hostLink) error {
	names := make([]string, len(ifbs))
	for i, l := range ifbs {
		names[i] = l.name
	}
	for name, err := range shape.DeleteIfbs(names) {
		return fmt.Errorf("floor: ifb %s: %w", name, err)
	}
	return nil
}

// decomRun leases n slots, stops the daemon and times bin's decommission
// of them, exec to exit; last is its last line of output. It checks that
// nothing of the prefix is left (settle).
func (r *runner) decomRun(ctx context.Context, n int, v restoreVariant, bin string) (took time.Duration, last string, err error) {
	if err := r.leaseStopped(ctx, n, v); err != nil {
		return 0, "", err
	}
	args := append([]string{"decommission", "--destroy-leased-slots", "--log-format=json"}, slotArgs(r.h, r.o)...)
	t0 := time.Now()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	took = time.Since(t0)
	if err != nil {
		return 0, "", fmt.Errorf("%w\n%s", err, out)
	}
	return took, lastLine(out), r.h.settle(ctx, r.o.settle)
}

// decomTable is the part's figures as a Markdown table.
func decomTable(rows []decomRow, bins []string) string {
	var b strings.Builder
	b.WriteString("| N leased | slots | kernel floor |")
	for _, bin := range bins {
		fmt.Fprintf(&b, " decommission (`%s`) | / floor |", bin)
	}
	b.WriteString("\n|---:|---|---:|")
	b.WriteString(strings.Repeat("---:|---:|", len(bins)))
	b.WriteString("\n")
	for _, row := range rows {
		floor := summarize(msOf(row.floor))
		fmt.Fprintf(&b, "| %d | %s | %s |", row.n, row.variant, fmtSummary(floor))
		for k := range bins {
			d := summarize(msOf(row.decom[k]))
			fmt.Fprintf(&b, " %s | %.2f× |", fmtSummary(d), d.Median/floor.Median)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// msOf converts durations to milliseconds.
func msOf(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for k, d := range ds {
		out[k] = ms(d)
	}
	return out
}
