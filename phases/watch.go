package phases

import (
	"context"
	"fmt"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/pool"
)

// warmOutcome is how a wait for warm slots ended.
type warmOutcome int

const (
	// warmReady: as many slots as asked are warm.
	warmReady warmOutcome = iota
	// warmFull: no index is free, and none is being made or given back:
	// every one is leased, lost or quarantined (a full node). More warm
	// slots come only as leases end.
	warmFull
	// warmNoRecord: the pool cannot record a slot it makes: the state
	// filesystem is full or read-only (the state-dir warning says which).
	warmNoRecord
)

// waitWarmSlots waits, following the pool's changes, until n slots are
// warm, or until no more can be made for now (warmFull, warmNoRecord): a
// full node and a full state disk are states to serve in, not failures
// to wait out. Each level seen goes to p's progress.
func waitWarmSlots(ctx context.Context, pl *pool.Pool, n int, p *lifecycle.Progress) (warmOutcome, pool.Level, error) {
	for {
		changed := pl.Changed()
		lv := pl.Level()
		p.SetDone(int64(lv.Idle))
		switch {
		case lv.Closed:
			return 0, lv, pool.ErrClosed
		case lv.Idle >= n:
			return warmReady, lv, nil
		case lv.Exhausted && lv.Filling == 0 && lv.Retiring == 0:
			return warmFull, lv, nil
		case lv.Backoff && stateFault(lv.LastError):
			return warmNoRecord, lv, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			if lv.LastError != nil {
				return 0, lv, fmt.Errorf("pool: %d of %d slots ready: %w (last fill error: %v)", lv.Idle, n, ctx.Err(), lv.LastError)
			}
			return 0, lv, fmt.Errorf("pool: %d of %d slots ready: %w", lv.Idle, n, ctx.Err())
		}
	}
}

// waitWarm waits for --pool-min-ready warm slots, or for the pool to say
// that no more can be made for now: the daemon then serves with what it
// has, and the pool warning says why.
func (d *Daemon) waitWarm(ctx context.Context, p *lifecycle.Progress) error {
	p.SetTotal(int64(d.cfg.PoolMinReady), "warm slots")
	out, lv, err := waitWarmSlots(ctx, d.pool, d.cfg.PoolMinReady, p)
	switch {
	case err != nil:
		return fmt.Errorf("wait for %d warm slots: %w", d.cfg.PoolMinReady, err)
	case out == warmFull:
		p.SetMessage(fmt.Sprintf("the node is full: %d warm of %d", lv.Idle, d.cfg.PoolMinReady))
		d.log.Warn("the node is full: every slot index is leased, lost or quarantined; serving with the warm slots there are, the pool refills as leases end",
			"warm", lv.Idle, "pool_min_ready", d.cfg.PoolMinReady, "leased", d.cfg.Slots.Slots-lv.Free-lv.Quarantined, "quarantined", lv.Quarantined)
	case out == warmNoRecord:
		p.SetMessage(fmt.Sprintf("no slot can be recorded: %d warm of %d", lv.Idle, d.cfg.PoolMinReady))
		d.log.Error("the pool cannot record the slots it makes: serving degraded (reads, and what needs no write); the state-dir warning says why",
			"warm", lv.Idle, "pool_min_ready", d.cfg.PoolMinReady, "error", lv.LastError)
	}
	return nil
}

// fillTask is the fill task: it reports the pool's way to --pool-size,
// and ends once there, or once no more can be made for now (the pool goes
// on making them as indices come back).
func (d *Daemon) fillTask(ctx context.Context, p *lifecycle.Progress) error {
	p.SetTotal(int64(d.cfg.PoolSize), "warm slots")
	out, lv, err := waitWarmSlots(ctx, d.pool, d.cfg.PoolSize, p)
	switch {
	case err != nil:
		return err
	case out == warmFull:
		p.SetMessage(fmt.Sprintf("the node is full: %d warm; more as leases end", lv.Idle))
	case out == warmNoRecord:
		p.SetMessage(fmt.Sprintf("no slot can be recorded: %d warm", lv.Idle))
	}
	return nil
}

// runWatch is the watch task: for as long as the daemon serves, the pool
// warning follows the pool's changes, and the state directory and the
// control socket are checked every --reconcile-interval (statedir.go).
func (d *Daemon) runWatch(ctx context.Context, _ *lifecycle.Progress) error {
	t := time.NewTicker(d.cfg.ReconcileInterval)
	defer t.Stop()
	d.state.check()
	for {
		changed := d.pool.Changed()
		d.poolWarning(d.pool.Level())
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-t.C:
			d.state.check()
		}
	}
}

// poolWarning sets the pool warning while no warm slot is there and none
// can be made now, or clears it.
func (d *Daemon) poolWarning(lv pool.Level) {
	if msg := poolMessage(lv, d.cfg.Slots.Slots); msg != "" {
		d.lc.Warn(warnPool, msg)
		return
	}
	d.lc.ClearWarning(warnPool)
}

// poolMessage is the pool warning for level lv of a pool over slots
// indices, or "" when there is nothing to warn of: a warm slot is there,
// or one is being made.
func poolMessage(lv pool.Level, slots int) string {
	switch {
	case lv.Closed || lv.Idle > 0:
		return ""
	case lv.Exhausted && lv.Filling == 0:
		return fmt.Sprintf("the warm pool is empty and no slot index is free: the node is full (%d of %d slots leased or lost, %d quarantined); an Acquire fails with ResourceExhausted until a lease ends, and the pool refills as leases end",
			slots-lv.Free-lv.Quarantined, slots, lv.Quarantined)
	case lv.Backoff && lv.LastError != nil:
		return fmt.Sprintf("the warm pool is empty and cannot make a slot: %v", lv.LastError)
	}
	return ""
}
