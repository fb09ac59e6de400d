package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// measureDead runs, at every N, each dead-slot strategy on its own freshly
// leaked set, interleaved rep by rep so that a change in the machine's load
// hits all of them alike; the serial baseline once per N up to -serial-max.
func (r *runner) measureDead(ctx context.Context) error {
	for _, n := range r.o.ns {
		if err := r.measureDeadN(ctx, n); err != nil {
			return fmt.Errorf("N=%d: %w", n, err)
		}
	}
	r.extrapolateSerial()
	return nil
}

func (r *runner) measureDeadN(ctx context.Context, n int) error {
	bg := r.res.point(stratBackground, n)
	fg := r.res.point(stratForeground, n)
	fl := r.res.point(stratFloor, n)
	se := r.res.point(stratSerial, n)
	serialRuns := r.o.serialReps
	switch {
	case n > r.o.serialMax:
		serialRuns = 0
		se.Skipped = fmt.Sprintf("N > -serial-max %d", r.o.serialMax)
	case serialRuns == 0:
		se.Skipped = "-serial-reps 0"
	}
	for rep := range r.o.reps {
		r.sampleLoad()
		if n == r.o.ns[0] {
			took, err := r.execVersion(ctx)
			if err != nil {
				return err
			}
			r.res.ExecMs = append(r.res.ExecMs, ms(took))
		}
		for _, c := range []struct {
			p    *Point
			mode string
		}{{bg, modeBackground}, {fg, modeForeground}} {
			run, err := r.deadRun(ctx, n, c.mode)
			if err != nil {
				return fmt.Errorf("%s: %w", c.mode, err)
			}
			c.p.Runs = append(c.p.Runs, run)
			r.logf("N=%d rep %d %s: answer %s (HTTP %d), SERVING %s, dead gone %s (report %s, %d veths cut off), RSS %.1f MiB\n\t%s",
				n, rep+1, c.mode, fmtMs(run.FirstAnswerMs), run.FirstStatus, fmtMs(run.ServingMs), fmtMs(run.DeadGoneMs),
				fmtMs(run.ReclaimMs), run.CutOff, run.RSSMiB, strings.Join(run.ReclaimLog, "\n\t"))
		}
		run, err := r.floorRun(ctx, n)
		if err != nil {
			return fmt.Errorf("floor: %w", err)
		}
		fl.Runs = append(fl.Runs, run)
		r.logf("N=%d rep %d floor: %s (unlink %s), set elements %s", n, rep+1, fmtMs(run.ServingMs), fmtMs(run.UnlinkMs), fmtMs(run.FirewallMs))

		if rep == 0 && n > 0 && r.o.breakdown {
			b, err := r.breakdownRun(ctx, n)
			if err != nil {
				return err
			}
			r.res.Breakdowns = append(r.res.Breakdowns, b)
			r.logf("N=%d reclaim.Run in process: %s (scan %s, procs %s, unlink %s, wait %s, firewall %s, %d cut off)",
				n, fmtMs(b.TotalMs), fmtMs(b.ScanMs), fmtMs(b.ProcsMs), fmtMs(b.UnlinkMs), fmtMs(b.WaitMs), fmtMs(b.FirewallMs), b.CutOff)
		}
		if rep < serialRuns {
			run, err := r.deadRun(ctx, n, modeSerial)
			if err != nil {
				return fmt.Errorf("serial baseline: %w", err)
			}
			se.Runs = append(se.Runs, run)
			r.logf("N=%d rep %d serial: answer %s (HTTP %d), SERVING %s", n, rep+1, fmtMs(run.FirstAnswerMs), run.FirstStatus, fmtMs(run.ServingMs))
		}
	}
	for _, p := range []*Point{bg, fg, fl, se} {
		p.summarizeRuns() // for the extrapolation; evaluate summarizes again
	}
	return nil
}

// execVersion times exec → exit of `phasegate version`.
func (r *runner) execVersion(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	if out, err := exec.CommandContext(ctx, r.bin, "version").CombinedOutput(); err != nil {
		return 0, fmt.Errorf("phasegate version: %w\n%s", err, out)
	}
	return time.Since(t0), nil
}

// deadRun leaks n slots, starts the daemon in mode and measures the start,
// the time until the dead are all gone, and the memory once the pool is
// full; then it stops the daemon and removes what it kept.
func (r *runner) deadRun(ctx context.Context, n int, mode string) (Run, error) {
	var run Run
	if err := r.leak(ctx, n); err != nil {
		return run, err
	}
	addr, err := freeAddr()
	if err != nil {
		return run, err
	}
	bin, args := r.bin, daemonArgs(r.h, addr, r.o, mode, r.o.poolSize)
	if mode == modeSerial {
		bin, args = r.serialBin, serialArgs(r.h, addr, r.o.poolSize)
	}
	d, su, failures, err := r.startServingBin(ctx, bin, args, nil, startTimeout(n, mode))
	if err != nil {
		return run, err
	}
	run, err = r.observeDead(ctx, d, su, n, mode != modeSerial)
	run.FailedStarts = failures
	if err != nil {
		d.kill()
		return run, err
	}
	if _, err := d.stop(); err != nil {
		return run, err
	}
	return run, r.reset(ctx)
}

// observeDead measures a daemon started on n dead slots that serves. With
// restores, it is phasegate and says what its start found in its restore
// line; the serial baseline keeps no records, so has none: its reclaim
// report's count of what it found is checked alike.
func (r *runner) observeDead(ctx context.Context, d *daemon, su startup, n int, restores bool) (Run, error) {
	var run Run
	run.FirstAnswerMs, run.FirstStatus = ms(su.FirstAnswer), su.FirstStatus
	run.FirstGRPCMs, run.FirstGRPC = ms(su.FirstGRPC), su.FirstGRPCSt
	run.ServingMs = ms(su.Serving)
	if restores {
		rl, err := d.restoreLine(ctx, 0)
		if err != nil {
			return run, err
		}
		if rl.Reclaim != n || rl.Restored != 0 || rl.Lost != 0 {
			return run, fmt.Errorf("restore line %+v: want %d dead and nothing restored\n%s", rl, n, d.logs)
		}
	}
	if n > 0 {
		rep, err := d.reclaimReport(ctx, 0, startTimeout(n, modeSerial))
		if err != nil {
			return run, err
		}
		if rep.Found != n || rep.Reclaimed != n || rep.Failed != 0 {
			return run, fmt.Errorf("reclaim report: found %d, reclaimed %d, failed %d; want %d reclaimed\n%s",
				rep.Found, rep.Reclaimed, rep.Failed, n, d.logs)
		}
		run.Reclaimed, run.ReclaimMs, run.CutOff = rep.Reclaimed, ms(rep.Duration), rep.CutOff
		run.DeadGoneMs = ms(rep.At.Sub(su.Exec))
		if rep.Duration > 0 {
			run.RatePerS = float64(n) / rep.Duration.Seconds()
		}
		if paced := d.pacedLine(); paced != "" {
			run.ReclaimLog = append(run.ReclaimLog, paced)
		}
		run.ReclaimLog = append(run.ReclaimLog, rep.Line)
		if left, err := r.deadLeft(); err != nil || left > 0 {
			return run, fmt.Errorf("after the reclaim report: %d host veths of the dead slots left (%v)", left, err)
		}
	}
	v, err := d.waitPoolFilled(ctx, 2*time.Minute)
	if err != nil {
		return run, err
	}
	run.Phases = phaseSpans(v, su.Exec)
	rss, hwm, err := d.memory()
	if err != nil {
		return run, err
	}
	run.RSSMiB, run.HWMMiB = mib(rss), mib(hwm)
	return run, nil
}

// deadLeft counts the host ends of the leaked set that still exist (by
// ifindex and name: a slot the daemon made since at the same index has
// another ifindex).
func (r *runner) deadLeft() (int, error) {
	left, err := linksPresent(r.h.leaked)
	return len(left), err
}

// floorRun leaks n slots and removes them by the kernel floor.
func (r *runner) floorRun(ctx context.Context, n int) (Run, error) {
	var run Run
	if err := r.leak(ctx, n); err != nil {
		return run, err
	}
	if n > 0 {
		f, err := kernelFloor(ctx, r.h, n, r.o.workers)
		if err != nil {
			return run, err
		}
		run.ServingMs, run.DeadGoneMs, run.ReclaimMs = ms(f.Duration), ms(f.Duration), ms(f.Duration)
		run.UnlinkMs, run.FirewallMs = ms(f.Unlink), ms(f.Firewall)
		run.Reclaimed = n
		run.RatePerS = float64(n) / f.Duration.Seconds()
	}
	return run, r.h.settle(ctx, r.o.settle)
}

// extrapolateSerial estimates the serial baseline at the N it skipped, from
// the largest N it measured: a fixed part (its figure at N=0, if measured)
// plus a per-slot cost. The estimate is labelled as such everywhere.
func (r *runner) extrapolateSerial() {
	var base, top *Point
	for _, n := range r.o.ns {
		p := r.res.find(stratSerial, n)
		if !p.measured() {
			continue
		}
		if n == 0 {
			base = p
		} else {
			top = p
		}
	}
	if top == nil {
		return
	}
	var fixedAnswer, fixedServing float64
	if base != nil {
		fixedAnswer, fixedServing = base.FirstAnswerMs.Median, base.ServingMs.Median
	}
	perSlotAnswer := (top.FirstAnswerMs.Median - fixedAnswer) / float64(top.N)
	perSlotServing := (top.ServingMs.Median - fixedServing) / float64(top.N)
	for _, p := range r.res.Points {
		if p.Strategy != stratSerial || p.measured() || p.N == 0 || p.Skipped == "" {
			continue
		}
		p.Extrapolated = &Extrapolation{
			FirstAnswerMs: fixedAnswer + perSlotAnswer*float64(p.N),
			ServingMs:     fixedServing + perSlotServing*float64(p.N),
			Basis: fmt.Sprintf("linear from the serial baseline measured at N=%d (%.1f ms per slot to serving)",
				top.N, perSlotServing),
		}
	}
}
