package phases

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/lease"
)

// runPopulate makes the pool, with the adopted slots warm and the restored
// leases handed out, and waits for --pool-min-ready warm slots, made from
// free indices before any dead slot is reclaimed: making a slot then never
// waits on the kernel's clean-up of the dead. The reclaim of the dead, the
// rest of the fill and the reconciler go on in the background.
func (d *Daemon) runPopulate(ctx context.Context, p *lifecycle.Progress) error {
	if d.pool == nil { // an attempt after a failed one has them already
		if err := d.newPool(); err != nil {
			return lifecycle.Permanent(err)
		}
		d.newSlotsService()
	}
	if err := d.reclaimForWarm(ctx, p); err != nil {
		return err
	}
	if err := d.waitWarm(ctx, p); err != nil {
		return err
	}
	d.deferTasks(p)
	return nil
}

// newPool makes the pool over the adopted slots (idle), the restored
// leases' (in use) and the indices the lost leases hold.
func (d *Daemon) newPool() error {
	d.repairAdopted()
	var inUse []*slot.Slot
	for _, l := range d.plan.restored {
		inUse = append(inUse, l.Slot)
	}
	// The lost leases' indices runStorage claimed, for PutLost.
	var lost []int
	for _, l := range d.plan.lost {
		if d.cfg.withinSlots(l.Rec.Index) {
			lost = append(lost, l.Rec.Index)
		}
	}
	pl, err := pool.New(timedSlots{Slots: d.mgr, create: &d.waits.create}, d.idx, pool.Options{
		Target: d.cfg.PoolSize,
		Grace:  d.cfg.PoolGrace,
		// The slots the pool tears down are its own idle ones and those
		// of ended leases: what lives in them is a tenant's.
		Teardown:  slot.TeardownOptions{Workers: d.cfg.ReclaimWorkers, KillOrphans: d.cfg.ReleaseKillOrphans},
		Idle:      d.plan.adopted,
		InUse:     inUse,
		Lost:      lost,
		OnIdle:    d.records.Idle,
		OnGone:    d.records.Gone,
		OnOrphans: d.logReleasedWithProcesses,
	})
	if err != nil {
		return err
	}
	d.pool = pl
	d.obs.setPool(pl)
	return nil
}

// shownPIDs bounds the pids one log line names.
const shownPIDs = 8

// logReleasedWithProcesses says, in one line per slot, what the teardown
// of a slot given back (its lease released or expired) did with the
// processes still inside its namespace: killed (--release-kill-orphans),
// or cut off with it, still running.
func (d *Daemon) logReleasedWithProcesses(orphans []slot.Orphan) {
	bySlot := map[int][]slot.Orphan{}
	var order []int
	for _, o := range orphans {
		if _, ok := bySlot[o.Index]; !ok {
			order = append(order, o.Index)
		}
		bySlot[o.Index] = append(bySlot[o.Index], o)
	}
	for _, i := range order {
		procs := bySlot[i]
		pids := make([]string, 0, min(len(procs), shownPIDs))
		killed := 0
		for k, o := range procs {
			if k < shownPIDs {
				pids = append(pids, fmt.Sprintf("%d(%s)", o.PID, o.Comm))
			}
			if o.Killed || o.Gone {
				killed++
			}
		}
		shown := strings.Join(pids, " ")
		if more := len(procs) - len(pids); more > 0 {
			shown += fmt.Sprintf(" and %d more", more)
		}
		switch {
		case d.cfg.ReleaseKillOrphans && killed == len(procs):
			d.log.Info("slot torn down with processes still inside: killed", "slot", i, "processes", len(procs), "pids", shown)
			continue
		case d.cfg.ReleaseKillOrphans:
			d.log.Warn("slot torn down with processes still inside: some could not be killed, cut off", "slot", i, "processes", len(procs), "pids", shown, "killed", killed)
			continue
		}
		d.log.Warn("slot torn down with processes still inside: cut off, still running (--release-kill-orphans ends them)", "slot", i, "processes", len(procs), "pids", shown)
	}
}

// newSlotsService makes the lease core over the pool, with the restored
// and lost leases, and the check of the restored ones.
func (d *Daemon) newSlotsService() {
	table := lease.NewTable(append(slices.Clone(d.plan.restored), d.plan.lost...))
	d.restore = &lease.RestoreCheck{Table: table, Pool: d.pool, Mgr: d.mgr, Found: d.plan.found, Teardown: d.cfg.teardownOptions(),
		Log: d.log, Health: d.lc, Verified: d.obs.verified, Lost: d.plan.lostIndices(), Records: d.records, Held: d.held, Task: taskVerify}
	d.slots = lease.New(d.mgr, d.pool, lease.Options{Records: d.records, Table: table, Log: d.log,
		Tracer: d.app.TracerProvider().Tracer(meterScope), Events: d.obs.leaseEv, Restore: d.restore,
		Impaired: d.impairedFor, Health: d.lc, Held: d.held, Teardown: d.cfg.teardownOptions(),
		TornDown: func(res *slot.TeardownResult) {
			d.logTeardownProblems(res.Failed, res.Orphans, res.ProcScan, res.WaitErr)
		}})
	d.obs.setLeases(d.slots)
}

// deferTasks starts the background tasks, which run once the daemon
// serves: the check of the restored leases, then the reclaim of the dead
// and the check inside the leases' slots; the reconciler, the egress
// check and the rest of the fill.
func (d *Daemon) deferTasks(p *lifecycle.Progress) {
	d.bg.verifyDone = make(chan struct{})
	if restored := d.plan.restored; len(restored) > 0 {
		p.Defer(taskVerify, func(ctx context.Context, tp *lifecycle.Progress) error {
			defer close(d.bg.verifyDone)
			return d.restore.Run(ctx, tp, restored)
		})
	} else {
		close(d.bg.verifyDone)
	}
	d.bg.deadDone = make(chan struct{})
	d.bg.reclaimCtx, d.bg.cancelReclaim = context.WithCancel(context.Background())
	if dead := d.deadToReclaim(); len(dead) > 0 {
		p.Defer(taskReclaim, func(ctx context.Context, tp *lifecycle.Progress) error {
			defer close(d.bg.deadDone)
			// After the leases' check: both need the kernel's networking
			// lock, and owners wait for the check (a Release, a retry),
			// not for the dead.
			select {
			case <-d.bg.verifyDone:
			case <-ctx.Done():
				return ctx.Err()
			}
			return d.reclaimDead(ctx, tp, dead)
		})
	} else {
		close(d.bg.deadDone)
	}
	p.Defer(taskReconcile, d.runReconciler)
	// Once the daemon serves: it only warns, and it lists every chain of
	// the host's nftables, the leases' egress chains among them, which
	// the kernel dumps in O(chains²) (each message of the dump walks the
	// list again from its start): with 10,000 leases it was the largest
	// part of a restart's critical path.
	p.Defer(taskCheckEgress, func(ctx context.Context, _ *lifecycle.Progress) error {
		d.checkEgress(ctx)
		return nil
	})
	p.Defer(taskWatchHost, d.watchHost)
	p.Defer(taskVerifyInside, func(ctx context.Context, tp *lifecycle.Progress) error {
		// After the leases' check: a lease it finds lost has no slot to
		// look into.
		select {
		case <-d.bg.verifyDone:
		case <-ctx.Done():
			return nil
		}
		return d.slots.VerifyInside(ctx, tp, d.plan.restored)
	})
	if d.cfg.PoolSize > d.cfg.PoolMinReady {
		p.Defer(taskFill, d.fillTask)
	}
	p.Defer(taskWatch, d.runWatch)
}

// reclaimForWarm reclaims, before the warm slots are awaited, as many dead
// slots as --pool-min-ready needs and no free index can give: on a host
// whose every index is leaked, the background reclaim (which starts once
// the warm slots are made) would otherwise wait for a warm slot that
// waits for it. Those reclaimed are left out of the background's share.
func (d *Daemon) reclaimForWarm(ctx context.Context, p *lifecycle.Progress) error {
	dead := d.deadToReclaim()
	need := d.cfg.PoolMinReady - len(d.pool.Snapshot().Idle) - d.pool.Indices().Free
	if need <= 0 || len(dead) == 0 {
		return nil
	}
	var pick []int
	for _, i := range dead.Indices() {
		if d.cfg.withinSlots(i) && len(pick) < need {
			pick = append(pick, i)
		}
	}
	p.SetMessage(fmt.Sprintf("no free index: reclaiming %d dead slots first", len(pick)))
	rep, err := reclaim.Slots(ctx, d.mgr, dead.Only(pick), reclaim.Options{
		Workers: d.cfg.ReclaimWorkers, KillOrphans: d.cfg.ReclaimKillOrphans,
	})
	if err != nil {
		return err
	}
	for _, i := range rep.Reclaimed {
		if ferr := d.pool.Free(i); ferr != nil {
			d.log.Warn("reclaimed slot's index could not be freed", "slot", i, "error", ferr)
		}
		delete(d.plan.dead, i)
	}
	d.obs.reclaimed(rep)
	d.logReport(rep)
	return nil
}

// stopPool waits for the background reclaim of dead slots to end, then
// stops the pool and keeps its warm slots, recorded, for the next start to
// adopt; leased slots are not touched: a restart, an upgrade
// or a stop never cuts a workload off. `phasegate decommission` destroys
// everything.
func (d *Daemon) stopPool(ctx context.Context) error {
	select {
	case <-d.bg.deadDone:
	case <-ctx.Done():
		d.bg.cancelReclaim()
		<-d.bg.deadDone
		d.log.Warn("stop: the background reclaim was cut short; the next start reclaims the rest")
	}
	kept, err := d.pool.Stop(ctx)
	held, lost := d.slots.Counts()
	d.log.Info("pool stopped: slots kept for the next start", "warm", len(kept), "leased", held-lost, "lost_leases", lost)
	return err
}

// repairAdopted gives the idle slots adopted from the last run the
// settings a slot is made with (a slot made by a build that set none has
// the host's) and the guest device they lack (that run had no
// --slot-guest-*, or something removed a part), before the pool can hand
// them out: there are at most a pool's worth, and nothing runs in them.
func (d *Daemon) repairAdopted() {
	for _, s := range d.plan.adopted {
		fixed, err := d.mgr.RepairSettings(s)
		if err == nil && d.cfg.Slots.Guest.Enabled() {
			var guest []string
			guest, err = d.mgr.RepairGuest(s)
			fixed = append(fixed, guest...)
		}
		switch {
		case err != nil:
			d.log.Error("adopted idle slot: settings or guest device could not be made", "slot", s.Index, "error", err)
		case len(fixed) > 0:
			d.log.Info("adopted idle slot: completed", "slot", s.Index, "repaired", strings.Join(fixed, ", "))
		}
	}
}
