package main

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// leaseOwner owns the slots the restore and upgrade parts lease.
const leaseOwner = "bench-lease"

// slowRestart is the restart time past which the restore part measures
// each kind of restart once at that N: every further rep would cost
// minutes without telling more.
const slowRestart = time.Minute

// Ways the restore part ends a daemon before starting it again.
const (
	endTerm = "SIGTERM"
	endKill = "kill -9"
)

// measureRestore leases N slots through the API at every N, then restarts
// the daemon -reps times after a SIGTERM and -reps times after a kill -9,
// alternately, on the same leased set: a restart must leave it untouched.
func (r *runner) measureRestore(ctx context.Context) error {
	for _, n := range r.o.ns {
		if err := r.measureRestoreN(ctx, n); err != nil {
			return fmt.Errorf("N=%d: %w", n, err)
		}
	}
	return nil
}

func (r *runner) measureRestoreN(ctx context.Context, n int) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	d, _, _, err := r.startServing(ctx, daemonArgs(r.h, addr, r.o, modeBackground, r.o.poolSize), nil, startTimeout(0, modeBackground))
	if err != nil {
		return err
	}
	if _, err := d.waitPoolFilled(ctx, 2*time.Minute); err != nil {
		return err
	}
	indices, setup, err := r.leaseSlots(ctx, d.slotsTarget(), n, leaseOwner)
	if err != nil {
		return err
	}
	if n > 0 {
		r.res.Leasing = append(r.res.Leasing, setup)
		r.logf("N=%d: leased %d slots through the API in %s (%.0f/s, %d concurrent Acquires)", n, n, fmtMs(setup.Ms), setup.PerS, setup.Clients)
	}
	// The restart should find the pool full, as a daemon that has served
	// a while would leave it.
	if _, err := d.waitPoolFilled(ctx, 5*time.Minute); err != nil {
		return err
	}
	before, err := r.h.identities(indices)
	if err != nil {
		return err
	}
	if len(before) != n {
		return fmt.Errorf("%d of the %d leased slots exist on the host", len(before), n)
	}
	var slowest time.Duration
	for rep := range r.o.reps {
		if rep > 0 && slowest > slowRestart {
			note := fmt.Sprintf("%d of -reps %d: a restart took %s (> %s)", rep, r.o.reps, fmtMs(ms(slowest)), fmtMs(ms(slowRestart)))
			for _, s := range restoreStrategies {
				r.res.point(s, n).Skipped = note
			}
			r.logf("N=%d: restarts cut to %s", n, note)
			break
		}
		for _, end := range []string{endTerm, endKill} {
			r.sampleLoad()
			var run Run
			run, d, err = r.restart(ctx, d, end, n, indices, before)
			p := r.res.point(map[string]string{endTerm: stratRestoreTerm, endKill: stratRestoreKill}[end], n)
			if errors.Is(err, errNoStart) {
				// The daemon cannot come back on this host now: record it,
				// clear the host and go on with the next N.
				run.NoStart = true
				p.Runs = append(p.Runs, run)
				r.logf("N=%d rep %d %s + start: NO START: %d attempts failed (first: %s); %d leased slots destroyed meanwhile",
					n, rep+1, end, len(run.FailedStarts), run.FailedStarts[0], run.Destroyed)
				return r.reset(ctx)
			}
			if err != nil {
				return fmt.Errorf("restart after %s: %w", end, err)
			}
			p.Runs = append(p.Runs, run)
			slowest = max(slowest, time.Duration(run.ServingMs*float64(time.Millisecond)))
			r.logf("N=%d rep %d %s + start: SERVING %s (first answer %s), every lease verified %s; restored %d, adopted %d, dead %d, lost %d; destroyed %d, listed %d; RSS %.1f MiB",
				n, rep+1, end, fmtMs(run.ServingMs), fmtMs(run.FirstAnswerMs), fmtVerifiedRun(run, n), run.Restored, run.Adopted, run.Dead, run.Lost,
				run.Destroyed, run.Listed, run.RSSMiB)
		}
	}
	if _, err := d.stop(); err != nil {
		return err
	}
	return r.reset(ctx)
}

// fmtVerifiedRun is a run's exec → every lease verified, or "—" when it
// restored none.
func fmtVerifiedRun(run Run, n int) string {
	if n == 0 {
		return "—"
	}
	return fmtMs(run.VerifiedMs)
}

// restart ends d (SIGTERM and wait, or kill -9), starts a daemon on the same
// host and measures its start, what it restored, and whether the leased
// slots are still the same kernel objects.
func (r *runner) restart(ctx context.Context, d *daemon, end string, n int, indices []int, before map[int]slotID) (Run, *daemon, error) {
	var run Run
	if end == endTerm {
		took, err := d.stop()
		if err != nil {
			return run, d, err
		}
		run.StopMs = ms(took)
	} else {
		if d.exited() {
			return run, d, d.exitErr("exited before it was killed")
		}
		d.kill()
	}
	addr, err := freeAddr()
	if err != nil {
		return run, d, err
	}
	d, su, failures, err := r.startServing(ctx, daemonArgs(r.h, addr, r.o, modeBackground, r.o.poolSize), nil, startTimeout(n, modeBackground))
	run.FailedStarts = failures
	if errors.Is(err, errNoStart) {
		// Did the failed starts leave the leased slots alone?
		now, ierr := r.h.identities(indices)
		if ierr != nil {
			return run, d, ierr
		}
		run.Destroyed = changed(before, now)
		return run, d, err
	}
	if err != nil {
		return run, d, err
	}
	run.FirstAnswerMs, run.FirstStatus = ms(su.FirstAnswer), su.FirstStatus
	run.FirstGRPCMs, run.FirstGRPC = ms(su.FirstGRPC), su.FirstGRPCSt
	run.ServingMs = ms(su.Serving)
	rl, err := d.restoreLine(ctx, 0)
	if err != nil {
		return run, d, err
	}
	run.Restored, run.Adopted, run.Dead, run.Lost = rl.Restored, rl.Adopted, rl.Reclaim, rl.Lost
	if rl.Restored > 0 {
		// Serving came first; the leases are verified after it.
		vl, err := d.verifiedLine(ctx, 0, 5*time.Minute)
		if err != nil {
			return run, d, err
		}
		run.VerifiedMs = ms(vl.at.Sub(su.Exec))
		run.Restored, run.Lost = vl.Intact, run.Lost+vl.Lost+vl.Unverified
	}
	now, err := r.h.identities(indices)
	if err != nil {
		return run, d, err
	}
	run.Destroyed = changed(before, now)
	if run.Listed, err = listAcquired(ctx, d.slotsTarget(), leaseOwner); err != nil {
		return run, d, err
	}
	// What a kill -9 left half made (a slot of the fill) is reclaimed in
	// the background: let it end, so that the next restart starts alike.
	if _, err := d.waitTaskDone(ctx, taskReclaimDead, 2*time.Minute); err != nil {
		return run, d, err
	}
	v, err := d.waitPoolFilled(ctx, 2*time.Minute)
	if err != nil {
		return run, d, err
	}
	run.Phases = phaseSpans(v, su.Exec)
	rss, hwm, err := d.memory()
	if err != nil {
		return run, d, err
	}
	run.RSSMiB, run.HWMMiB = mib(rss), mib(hwm)
	return run, d, nil
}
