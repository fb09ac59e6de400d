package phases

import (
	"context"
	"fmt"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/slot"
)

// deadToReclaim is what the background reclaim has to do: the dead slots,
// unless the reclaim phase did them.
func (d *Daemon) deadToReclaim() slot.Inventory {
	if d.cfg.reclaimInForeground() {
		return nil
	}
	return d.plan.dead
}

// reclaimDead tears the dead slots down in the background, paced so that
// health checks and Acquire stay fast, and frees their indices as they go.
// While it runs /health says warn, with its progress, rate and time left.
//
// A stop halts it at the end of the batch in hand (about a second): the
// slots started are finished whole, the rest is left for the next start,
// which reclaims it in the background again; the lifecycle waits for the
// task before the pool's stop. An upgrade cuts it short at once: the new
// image reclaims what is left.
func (d *Daemon) reclaimDead(ctx context.Context, p *lifecycle.Progress, dead slot.Inventory) error {
	d.lc.Warn(taskReclaim, fmt.Sprintf("reclaiming %d dead slots in the background", len(dead)))
	defer d.lc.ClearWarning(taskReclaim)
	p.SetTotal(int64(len(dead)), "namespaces")
	halt := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		if d.app.Upgrading() {
			d.bg.cancelReclaim()
		}
		close(halt)
	})
	defer stop()
	// Batches paced by the daemon's own waits: the kernel holds its
	// networking lock while it destroys a batch, and a slot made meanwhile
	// (an Acquire on an empty pool, the fill) waits for it, as a health
	// answer waits for the CPU the destruction takes. Big batches are the
	// fastest overall (docs/benchmarks/batches.md), so they grow while
	// nothing waits too long, and shrink, with pauses, when something does.
	pacer, stopProbe, err := d.newPacer()
	if err != nil {
		return err
	}
	defer reclaimProcs(d.cfg.ReclaimWorkers)()
	rep, err := reclaim.Slots(d.bg.reclaimCtx, d.mgr, dead, reclaim.Options{
		Halt:        halt,
		Workers:     d.cfg.ReclaimWorkers,
		Nice:        reclaimNice,
		KillOrphans: d.cfg.ReclaimKillOrphans,
		Pacer:       pacer,
		Progress:    teardownProgress(p),
	})
	stopProbe()
	st := pacer.Stats()
	d.log.Info("background reclaim paced", "batches", st.Batches, "slowed", st.Slowed, "largest_batch", st.Largest,
		"paused", st.Paused.Round(time.Millisecond).String(), "over", fmt.Sprint(st.Over))
	for _, i := range rep.Reclaimed {
		if !d.cfg.withinSlots(i) {
			continue
		}
		if ferr := d.pool.Free(i); ferr != nil {
			d.log.Warn("reclaimed slot's index could not be freed", "slot", i, "error", ferr)
		}
	}
	d.obs.reclaimed(rep)
	d.logReport(rep)
	if ctx.Err() != nil {
		return ctx.Err() // the drain: what is left waits for the next start
	}
	return err
}
