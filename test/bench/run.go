package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

// runner runs the benchmark's measurements on one host.
type runner struct {
	o   options
	h   *host
	bin string
	log io.Writer
	res *Results
}

// run measures everything the options ask for and returns the results. The
// host is swept on every return path, including cancellation.
func run(ctx context.Context, o options, log io.Writer) (res *Results, err error) {
	res = &Results{
		Started:    time.Now(),
		Command:    commandLine(o.args),
		Commit:     gitRevision(),
		Machine:    describeMachine(),
		Strategies: []string{stratPhasegate, stratSerial, stratFloor},
	}
	maxN := max(o.loadN, slices.Max(o.ns))
	h, err := newHost(maxN+spareSlots, o.cidr)
	if err != nil {
		return nil, err
	}
	defer func() {
		if serr := h.sweep(); serr != nil {
			err = errors.Join(err, fmt.Errorf("sweep of prefix %q: %w", h.cfg.Prefix, serr))
		}
	}()
	res.Settings = Settings{
		Ns: o.ns, Skipped10k: !slices.ContainsFunc(o.ns, func(n int) bool { return n >= 10000 }),
		Reps: o.reps, SerialReps: o.serialReps, SerialMax: o.serialMax,
		LoadN: o.loadN, LoadReps: o.loadReps, Rate: o.rate, Workers: o.workers, PoolSize: o.poolSize,
		SlotIndices: h.cfg.Slots, SettleMs: ms(o.settle),
	}
	fmt.Fprintf(log, "bench: prefix %s, netns dir %s, load average %.2f\n", h.cfg.Prefix, h.cfg.NetnsDir, res.Machine.LoadStart)

	bin := o.binary
	if bin == "" {
		fmt.Fprintln(log, "bench: building ./cmd/phasegate")
		if bin, err = buildPhasegate(ctx, h.base); err != nil {
			return nil, err
		}
	}
	r := &runner{o: o, h: h, bin: bin, log: log, res: res}
	defer r.finish()
	for _, n := range o.ns {
		if err := r.measureN(ctx, n); err != nil {
			return res, fmt.Errorf("N=%d: %w", n, err)
		}
	}
	r.extrapolateSerial()
	if o.loadN > 0 {
		if err := r.measureLoad(ctx); err != nil {
			return res, fmt.Errorf("latency under reclaim: %w", err)
		}
	}
	return res, nil
}

// finish completes the results with what was measured so far: summaries,
// goals and notes. It runs on every return, so that a run that failed half
// way still writes its figures.
func (r *runner) finish() {
	for _, p := range r.res.Points {
		p.summarizeRuns()
	}
	r.res.Machine.sampleLoad()
	r.res.Finished = time.Now()
	r.res.Goals = evaluateGoals(r.res)
	r.res.Notes = notes(r.res)
}

// logf prints a progress line with the time.
func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.log, "%s  %s\n", time.Now().Format(time.TimeOnly), fmt.Sprintf(format, args...))
}

// measureN runs every strategy at n, interleaved rep by rep so that a change
// in the machine's load hits all of them alike.
func (r *runner) measureN(ctx context.Context, n int) error {
	pg := r.res.point(stratPhasegate, n)
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
		r.res.Machine.sampleLoad()
		run, err := r.daemonRun(ctx, n, false)
		if err != nil {
			return fmt.Errorf("phasegate: %w", err)
		}
		pg.Runs = append(pg.Runs, run)
		r.logf("N=%d rep %d phasegate: answer %s (HTTP %d), serving %s, reclaim %s (%d veths cut off), RSS %.1f MiB",
			n, rep+1, fmtMs(run.FirstAnswerMs), run.FirstStatus, fmtMs(run.ServingMs), fmtMs(run.ReclaimMs), run.CutOff, run.RSSMiB)

		if run, err = r.floorRun(ctx, n); err != nil {
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
			if run, err = r.daemonRun(ctx, n, true); err != nil {
				return fmt.Errorf("serial baseline: %w", err)
			}
			se.Runs = append(se.Runs, run)
			r.logf("N=%d rep %d serial: answer %s (HTTP %d), serving %s, reclaim %s",
				n, rep+1, fmtMs(run.FirstAnswerMs), run.FirstStatus, fmtMs(run.ServingMs), fmtMs(run.ReclaimMs))
		}
	}
	for _, p := range []*Point{pg, fl, se} {
		p.summarizeRuns() // for the extrapolation; finish summarizes again
	}
	return nil
}

// leak makes n leaked slots, then pauses for -settle: the kernel's
// background work after making thousands of namespaces (RCU callbacks,
// address configuration) would otherwise slow the next exec.
func (r *runner) leak(ctx context.Context, n int) error {
	if n == 0 {
		return nil
	}
	t0 := time.Now()
	if err := r.h.leak(ctx, n); err != nil {
		return err
	}
	r.logf("leaked %d slots in %s", n, fmtMs(ms(time.Since(t0))))
	return sleep(ctx, r.o.settle)
}

// daemonRun leaks n slots, starts the daemon (serial: the seed's startup)
// and measures the start, the reclaim and the memory once the pool is full.
func (r *runner) daemonRun(ctx context.Context, n int, serial bool) (Run, error) {
	var run Run
	if err := r.leak(ctx, n); err != nil {
		return run, err
	}
	addr, err := freeAddr()
	if err != nil {
		return run, err
	}
	d, err := startDaemon(r.bin, daemonArgs(r.h, addr, r.o, serial))
	if err != nil {
		return run, err
	}
	run, err = r.observe(ctx, d, n, serial)
	if err != nil {
		d.kill()
		return run, err
	}
	if err := d.stop(); err != nil {
		return run, err
	}
	return run, r.h.settle(ctx, r.o.settle)
}

// startTimeout bounds a start: generous, for a machine shared with other
// namespace-heavy work (the kernel's namespace clean-up is one worker for
// everybody) and for the serial baseline's ~54 ms per slot.
func startTimeout(n int, serial bool) time.Duration {
	if serial {
		return 2*time.Minute + time.Duration(n)*200*time.Millisecond
	}
	return 2*time.Minute + time.Duration(n)*50*time.Millisecond
}

// observe measures a started daemon until its pool is full.
func (r *runner) observe(ctx context.Context, d *daemon, n int, serial bool) (Run, error) {
	var run Run
	su, err := d.measureStartup(ctx, startTimeout(n, serial))
	if err != nil {
		return run, err
	}
	run.FirstAnswerMs, run.FirstStatus = ms(su.FirstAnswer), su.FirstStatus
	run.FirstGRPCMs, run.FirstGRPC = ms(su.FirstGRPC), su.FirstGRPCSt
	run.ServingMs = ms(su.Serving)
	rep, err := d.reclaimReport()
	if err != nil {
		return run, err
	}
	if rep.Found != n || rep.Reclaimed != n || rep.Failed != 0 {
		return run, fmt.Errorf("reclaim report: found %d, reclaimed %d, failed %d; want %d reclaimed\n%s",
			rep.Found, rep.Reclaimed, rep.Failed, n, d.logs)
	}
	run.Reclaimed, run.ReclaimMs, run.CutOff = rep.Reclaimed, ms(rep.Duration), rep.CutOff
	if n > 0 && rep.Duration > 0 {
		run.RatePerS = float64(n) / rep.Duration.Seconds()
	}
	v, err := d.waitPoolFilled(ctx)
	if err != nil {
		return run, err
	}
	run.Phases = phaseSpans(v, d.began)
	rss, hwm, err := d.memory()
	if err != nil {
		return run, err
	}
	run.RSSMiB, run.HWMMiB = mib(rss), mib(hwm)
	return run, nil
}

// phaseSpans converts the lifecycle view's phases to offsets from began.
func phaseSpans(v lifecycleView, began time.Time) []PhaseSpan {
	spans := make([]PhaseSpan, 0, len(v.Phases))
	for _, p := range v.Phases {
		s := PhaseSpan{Name: p.Name, State: p.State}
		if !p.Started.IsZero() {
			s.StartMs = ms(p.Started.Sub(began))
		}
		if !p.Ended.IsZero() {
			s.EndMs = ms(p.Ended.Sub(began))
		}
		spans = append(spans, s)
	}
	return spans
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
		run.ServingMs, run.ReclaimMs = ms(f.Duration), ms(f.Duration)
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
