package phases

import (
	"context"
	"fmt"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/reconcile"
	"github.com/phasegate/phasegate/network/slot"
)

// runReconciler sweeps quarantined and stray slots every interval, once
// the background reclaim of the dead is over (they would fight over the
// same indices), and checks the leased slots against each pass's scan
// (broken.go). Its passes are logged when they do something or fail, and
// counted.
func (d *Daemon) runReconciler(ctx context.Context, _ *lifecycle.Progress) error {
	select {
	case <-d.bg.deadDone:
	case <-ctx.Done():
		return ctx.Err()
	}
	// Slots held, and those whose record cannot be read, may be
	// somebody's workload: quarantined, never torn down by a pass. The
	// held ones change while the daemon runs (an operator adopts or
	// releases them, the check of the restored leases holds more).
	bad := map[int]bool{}
	if d.plan != nil {
		for _, i := range d.plan.bad {
			bad[i] = true
		}
	}
	rec := reconcile.New(d.mgr, d.pool, reconcile.Options{
		Interval: d.cfg.ReconcileInterval,
		Teardown: d.cfg.teardownOptions(),
		OnPass: func(pass reconcile.Pass) {
			d.reconciled(pass)
			if pass.Survey != nil {
				d.slots.CheckLeased(ctx, pass.Survey, pass.Start)
			}
			d.syncPorts(ctx)
		},
		Keep: func(i int) bool { return bad[i] || d.held.Has(i) },
	})
	err := rec.Run(ctx)
	if ctx.Err() != nil {
		return ctx.Err() // stopped by the drain: not a fault
	}
	return err
}

// syncPorts makes the published ports' maps hold the leases' mappings
// again (lease.Service.SyncPorts), logging what it repaired.
func (d *Daemon) syncPorts(ctx context.Context) {
	added, removed, err := d.slots.SyncPorts(ctx)
	switch {
	case err != nil:
		d.log.Warn("reconcile pass could not check the published ports", "error", err)
	case added > 0 || removed > 0:
		d.log.Info("reconcile pass: published ports repaired", "put_back", added, "removed", removed)
	}
}

// reconciled logs and counts a reconcile pass: at info when it freed or
// claimed slots, at warn when it failed, and not at all when it found
// nothing to do.
func (d *Daemon) reconciled(pass reconcile.Pass) {
	d.obs.reconciled(pass)
	if pass.Scan != nil {
		d.log.Warn("reconcile pass could not scan the host", "error", pass.Scan)
		return
	}
	for _, u := range pass.Unreadable {
		d.log.Warn("netns entry could not be inspected: left alone, quarantined", "slot", u.Index, "name", u.Name, "error", u.Err)
	}
	var orphans []slot.Orphan
	var procScan, waitErr error
	if t := pass.Teardown; t != nil {
		orphans, procScan, waitErr = t.Orphans, t.ProcScan, t.WaitErr
	}
	d.logTeardownProblems(pass.Failed, orphans, procScan, waitErr)
	if len(pass.Claimed) > 0 || len(pass.Freed) > 0 || len(pass.Beyond) > 0 {
		d.log.Info("reconcile pass", "claimed", fmt.Sprint(pass.Claimed), "freed", len(pass.Freed), "beyond", fmt.Sprint(pass.Beyond),
			"failed", len(pass.Failed), "duration", pass.Duration.Round(time.Millisecond).String())
	}
}
