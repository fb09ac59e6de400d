package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
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

// restoreVariant is one way the restore part runs the daemon and leases
// its slots.
type restoreVariant struct {
	// term and kill are the strategies of its two kinds of restart.
	term, kill string
	// guest: the daemon runs with the guest profile (extra) and every
	// lease carries an egress policy (guestPolicy), checked after each
	// restart.
	guest bool
	// datapath: every lease holds a published port and bandwidth limits
	// (datapathRequest).
	datapath bool
	extra    []string
}

// strategy is the variant's strategy for a restart ended by end.
func (v restoreVariant) strategy(end string) string {
	if end == endTerm {
		return v.term
	}
	return v.kill
}

// name names the variant in progress lines.
func (v restoreVariant) name() string {
	switch {
	case v.guest:
		return "guest+policy"
	case v.datapath:
		return "ports+limits"
	}
	return "plain"
}

// restoreVariants are the variants the options ask for: plain, with
// -restore-guest the guest profile with a policy on every lease, and with
// -restore-datapath a published port and limits on every lease.
func (r *runner) restoreVariants() []restoreVariant {
	vs := []restoreVariant{{term: stratRestoreTerm, kill: stratRestoreKill}}
	if r.o.restoreGuest {
		vs = append(vs, restoreVariant{term: stratGuestTerm, kill: stratGuestKill, guest: true, extra: guestArgs(r.o.guestAddr)})
	}
	if r.o.restoreDatapath {
		vs = append(vs, restoreVariant{term: stratDatapathTerm, kill: stratDatapathKill, datapath: true})
	}
	return vs
}

// request is what the variant adds to the k-th lease's Acquire, nil for
// nothing.
func (v restoreVariant) request() func(k int, req *phasegatev1.AcquireRequest) {
	switch {
	case v.guest:
		return func(k int, req *phasegatev1.AcquireRequest) { req.EgressPolicy = guestPolicy(k) }
	case v.datapath:
		return datapathRequest
	}
	return nil
}

// guestCheck is what the guest+policy variant checks after each restart:
// each lease's policy as it was acquired (canonicalPolicy, by index) and
// what a sample of the leased namespaces held before the first restart
// (insideSnapshot, by index).
type guestCheck struct {
	want   map[int]string
	sample map[int]string
}

// measureRestore leases N slots through the API at every N, then restarts
// the daemon -reps times after a SIGTERM and -reps times after a kill -9,
// alternately, on the same leased set: a restart must leave it untouched.
// Each variant runs at each N in turn (plain, then guest+policy), so that
// the two are compared in the same minutes.
func (r *runner) measureRestore(ctx context.Context) error {
	if r.o.restoreGuest {
		r.part.Settings.GuestFlags = strings.Join(guestArgs(r.o.guestAddr), " ")
		r.part.Settings.GuestPolicies = guestPolicyMix()
	}
	for _, n := range r.o.ns {
		for _, v := range r.restoreVariants() {
			if err := r.measureRestoreN(ctx, n, v); err != nil {
				return fmt.Errorf("N=%d %s: %w", n, v.name(), err)
			}
		}
	}
	return nil
}

// measureRestoreN leases n slots (with the variant's flags and policy)
// and restarts the daemon -reps times each way, SIGTERM and kill -9,
// measuring each start; it cuts the reps short after a slow restart and
// goes on with the next N when the daemon cannot start again.
func (r *runner) measureRestoreN(ctx context.Context, n int, v restoreVariant) error {
	f, err := r.leaseRestoreFleet(ctx, n, v)
	if err != nil {
		return err
	}
	d, indices, before, gc := f.d, f.indices, f.before, f.gc
	var slowest time.Duration
	for rep := range r.o.reps {
		if rep > 0 && slowest > slowRestart {
			note := fmt.Sprintf("%d of -reps %d: a restart took %s (> %s)", rep, r.o.reps, fmtMs(ms(slowest)), fmtMs(ms(slowRestart)))
			for _, s := range []string{v.term, v.kill} {
				r.res.point(s, n).Skipped = note
			}
			r.logf("N=%d %s: restarts cut to %s", n, v.name(), note)
			break
		}
		for _, end := range []string{endTerm, endKill} {
			r.sampleLoad()
			var run Run
			run, d, err = r.restart(ctx, d, v, end, n, indices, before, gc)
			p := r.res.point(v.strategy(end), n)
			if errors.Is(err, errNoStart) {
				// The daemon cannot come back on this host now: record it,
				// clear the host and go on with the next N.
				run.NoStart = true
				p.Runs = append(p.Runs, run)
				r.logf("N=%d %s rep %d %s + start: NO START: %d attempts failed (first: %s); %d leased slots destroyed meanwhile",
					n, v.name(), rep+1, end, len(run.FailedStarts), run.FailedStarts[0], run.Destroyed)
				return r.reset(ctx)
			}
			if err != nil {
				return fmt.Errorf("restart after %s: %w", end, err)
			}
			p.Runs = append(p.Runs, run)
			slowest = max(slowest, time.Duration(run.ServingMs*float64(time.Millisecond)))
			r.logf("N=%d %s rep %d %s + start: SERVING %s (first answer %s), every lease verified %s; restored %d, adopted %d, dead %d, lost %d; destroyed %d, listed %d; RSS %.1f MiB%s",
				n, v.name(), rep+1, end, fmtMs(run.ServingMs), fmtMs(run.FirstAnswerMs), fmtVerifiedRun(run, n), run.Restored, run.Adopted, run.Dead, run.Lost,
				run.Destroyed, run.Listed, run.RSSMiB, fmtGuestRun(run, v))
		}
	}
	if _, err := d.stop(); err != nil {
		return err
	}
	return r.reset(ctx)
}

// restoreFleet is what measureRestoreN restarts: the daemon holding the
// leases, the leased slots' indices and what they were, and for the
// guest variant the baseline of what their namespaces hold.
type restoreFleet struct {
	d       *daemon
	indices []int
	before  map[int]slotID
	gc      *guestCheck
}

// leaseRestoreFleet starts a daemon with the variant's flags, leases n
// slots through its API (each with the guest policy for that variant),
// waits for its pool to fill again and notes what the slots are.
func (r *runner) leaseRestoreFleet(ctx context.Context, n int, v restoreVariant) (*restoreFleet, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := append(daemonArgs(r.h, addr, r.o, modeBackground, r.o.poolSize), v.extra...)
	d, _, _, err := r.startServing(ctx, args, nil, startTimeout(0, modeBackground))
	if err != nil {
		return nil, err
	}
	if _, err := d.waitPoolFilled(ctx, 2*time.Minute); err != nil {
		return nil, err
	}
	leases, setup, err := r.leaseSlots(ctx, d.slotsTarget(), n, leaseOwner, v.request())
	if err != nil {
		return nil, err
	}
	indices := indicesOf(leases)
	if n > 0 {
		setup.Guest, setup.Datapath = v.guest, v.datapath
		r.res.Leasing = append(r.res.Leasing, setup)
		r.logf("N=%d %s: leased %d slots through the API in %s (%.0f/s, %d concurrent Acquires)", n, v.name(), n, fmtMs(setup.Ms), setup.PerS, setup.Clients)
	}
	// The restart should find the pool full, as a daemon that has served
	// a while would leave it.
	if _, err := d.waitPoolFilled(ctx, 5*time.Minute); err != nil {
		return nil, err
	}
	before, err := r.h.identities(indices)
	if err != nil {
		return nil, err
	}
	if len(before) != n {
		return nil, fmt.Errorf("%d of the %d leased slots exist on the host", len(before), n)
	}
	f := &restoreFleet{d: d, indices: indices, before: before}
	if v.guest {
		if f.gc, err = r.guestBaseline(ctx, d, leases); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// fmtGuestRun is the guest+policy and ports+limits variants' part of a
// progress line.
func fmtGuestRun(run Run, v restoreVariant) string {
	if v.datapath {
		return fmt.Sprintf("; listed with their port and limits %d", run.DatapathKept)
	}
	if !v.guest {
		return ""
	}
	s := fmt.Sprintf("; inside verified %s, repaired %d; policies kept %d/%d; sampled namespaces unchanged %d/%d",
		fmtMs(run.InsideVerifiedMs), run.InsideRepaired, run.PoliciesKept, run.PoliciesChecked, run.InsideKept, run.InsideSampled)
	if len(run.PolicyDiffs) > 0 {
		s += " (first: " + run.PolicyDiffs[0] + ")"
	}
	return s
}

// guestBaseline checks that every lease carries the policy it was
// acquired with, as List shows it, and reads a sample of the leased
// namespaces before the first restart.
func (r *runner) guestBaseline(ctx context.Context, d *daemon, leases []leaseRef) (*guestCheck, error) {
	gc := &guestCheck{want: make(map[int]string, len(leases)), sample: map[int]string{}}
	for _, l := range leases {
		gc.want[l.index] = l.policy
	}
	slots, err := listOwned(ctx, d.slotsTarget(), leaseOwner)
	if err != nil {
		return nil, err
	}
	if _, bad := policyMismatches(slots, gc.want); len(bad) > 0 {
		return nil, fmt.Errorf("before any restart, %d leases do not show the policy they were acquired with (first: %s)", len(bad), bad[0])
	}
	for _, i := range sampleIndices(indicesOf(leases), guestSample) {
		snap, err := insideSnapshot(ctx, r.h.cfg.NetnsPath(i))
		if err != nil {
			return nil, fmt.Errorf("before any restart: %w", err)
		}
		gc.sample[i] = snap
	}
	return gc, nil
}

// checkGuest waits for the new daemon's check of the leases' insides and
// then checks them itself: every lease's policy in List, the sample's
// namespaces with nft and ip.
func (r *runner) checkGuest(ctx context.Context, d *daemon, su startup, gc *guestCheck, run *Run) error {
	il, err := d.insideLine(ctx, 0, 15*time.Minute)
	if err != nil {
		return err
	}
	run.InsideVerifiedMs, run.InsideRepaired = ms(il.at.Sub(su.Exec)), il.Repaired
	slots, err := listOwned(ctx, d.slotsTarget(), leaseOwner)
	if err != nil {
		return err
	}
	run.Listed = countAcquired(slots)
	checked, bad := policyMismatches(slots, gc.want)
	run.PoliciesChecked, run.PoliciesKept = checked, checked-len(bad)
	for i, want := range gc.sample {
		run.InsideSampled++
		now, err := insideSnapshot(ctx, r.h.cfg.NetnsPath(i))
		switch {
		case err != nil:
			bad = append(bad, oneLine(err))
		case now != want:
			bad = append(bad, fmt.Sprintf("slot %d: its namespace's tables, rules or tap changed (nft -a -s list ruleset; ip link)", i))
			r.logf("slot %d's namespace changed across the restart; before:\n%s\nafter:\n%s", i, want, now)
		default:
			run.InsideKept++
		}
	}
	run.PolicyDiffs = bad[:min(len(bad), 3)]
	return nil
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
//
// The guest+policy variant (gc not nil) also waits for the daemon's check
// of the leases' insides and checks them itself (checkGuest).
func (r *runner) restart(ctx context.Context, d *daemon, v restoreVariant, end string, n int, indices []int, before map[int]slotID,
	gc *guestCheck) (Run, *daemon, error) {
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
	args := append(daemonArgs(r.h, addr, r.o, modeBackground, r.o.poolSize), v.extra...)
	d, su, failures, err := r.startServing(ctx, args, nil, startTimeout(n, modeBackground))
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
	if gc != nil && rl.Restored > 0 {
		if err := r.checkGuest(ctx, d, su, gc, &run); err != nil {
			return run, d, err
		}
	} else if err := listAfterRestart(ctx, d, v, &run); err != nil {
		return run, d, err
	}
	// What a kill -9 left half made (a slot of the fill) is reclaimed in
	// the background: let it end, so that the next restart starts alike.
	if _, err := d.waitTaskDone(ctx, taskReclaimDead, 2*time.Minute); err != nil {
		return run, d, err
	}
	lv, err := d.waitPoolFilled(ctx, 2*time.Minute)
	if err != nil {
		return run, d, err
	}
	run.Phases = phaseSpans(lv, su.Exec)
	rss, hwm, err := d.memory()
	if err != nil {
		return run, d, err
	}
	run.RSSMiB, run.HWMMiB = mib(rss), mib(hwm)
	return run, d, nil
}
