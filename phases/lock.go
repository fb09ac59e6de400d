package phases

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// runLock is the lock phase: the slots of the prefix (lockSlots), then the
// slot CIDR (claimCIDR), then the control socket (openControl), which
// only the holder of both may bind. The check of the host's own use of
// the CIDR ran before, in New (checkHostCIDR), so that its refusal leaves
// no lock file and binds no port. The prefix
// comes first, so that a second daemon of the same prefix is still told
// that (exit 1, naming the holder). A failed phase is not stopped: what a
// later step could not do, the earlier steps' locks are let go here.
func (d *Daemon) runLock(ctx context.Context, p *lifecycle.Progress) error {
	d.checkDrainDelay()
	if err := d.lockSlots(ctx, p); err != nil {
		return err
	}
	if err := d.claimCIDR(ctx); err != nil {
		_ = d.lock.Unlock()
		return err
	}
	if err := d.openControl(ctx); err != nil {
		_ = d.unlockCIDRs()
		_ = d.lock.Unlock()
		return lifecycle.Permanent(err)
	}
	return nil
}

// stopLock releases what the lock phase and the reclaim phase's opening
// of the records took, in reverse: the control socket, the records, the
// CIDR lock, the slots lock. In an upgrade the locks are kept: the new
// image takes their descriptors over, so no other daemon can slip in
// between.
func (d *Daemon) stopLock(ctx context.Context) error {
	err := d.closeControl(ctx)
	if d.store != nil {
		err = errors.Join(err, d.store.Close())
	}
	if d.app.Upgrading() {
		return err
	}
	return errors.Join(err, d.unlockCIDRs(), d.lock.Unlock())
}

// lockHandover names the lock's descriptor across an in-place upgrade.
const lockHandover = "lock"

// lockSlots takes the lock of the slots of the prefix, or keeps the one
// the previous image handed over in an in-place upgrade.
func (d *Daemon) lockSlots(ctx context.Context, p *lifecycle.Progress) error {
	if err := d.cfg.ensureStateDir(); err != nil {
		return lifecycle.Permanent(err)
	}
	path, err := d.cfg.LockPath()
	if err != nil {
		return lifecycle.Permanent(err)
	}
	if f := d.app.Inherited(lockHandover); f != nil {
		// An in-place upgrade: the old image kept the lock for us.
		legacy, err := lockfile.SlotsPath(lockfile.LegacyDir, d.cfg.Slots.NetnsDir, d.cfg.Slots.Prefix)
		if err != nil {
			return lifecycle.Permanent(err)
		}
		l, err := d.adoptLock(f, path, legacy, func() (*lockfile.Lock, error) { return acquireLock(ctx, d.cfg, path, 0) })
		if err != nil {
			return lifecycle.Permanent(asConfig(fmt.Errorf("the lock handed over by the previous image: %w", err)))
		}
		d.lock = l
		d.app.HandOver(lockHandover, l.File())
		p.SetMessage("kept across the upgrade")
		return nil
	}
	if d.cfg.LockWait > 0 {
		p.SetMessage("waiting up to " + d.cfg.LockWait.String() + " for " + path)
	}
	l, err := acquireLock(ctx, d.cfg, path, d.cfg.LockWait)
	if err != nil {
		return lifecycle.Permanent(err)
	}
	d.lock = l
	d.app.HandOver(lockHandover, l.File())
	return nil
}

// acquireLock takes the slots lock at path, waiting up to wait: a holder
// is a *SlotsHeldError, a lock directory another user could change a
// configuration error.
func acquireLock(ctx context.Context, cfg Config, path string, wait time.Duration) (*lockfile.Lock, error) {
	l, err := lockfile.Acquire(ctx, path, wait)
	if held := (*lockfile.HeldError)(nil); errors.As(err, &held) {
		return nil, cfg.HeldError(held)
	}
	return l, asConfig(err)
}

// checkDrainDelay warns when the drain is not longer than the interval of
// a checker that must see it: that checker may keep the daemon in rotation
// until the port closes (seen: a Consul check every 5s against a 2s drain).
func (d *Daemon) checkDrainDelay() {
	if d.cfg.CheckInterval == 0 || d.cfg.DrainDelay > d.cfg.CheckInterval {
		return
	}
	msg := fmt.Sprintf("--drain-delay %v is not longer than --check-interval %v: a checker may not see the drain before the port closes; raise --drain-delay (and the supervisor's stop timeout) or shorten the check's interval",
		d.cfg.DrainDelay, d.cfg.CheckInterval)
	d.log.Warn("drain shorter than a check interval", "drain_delay", d.cfg.DrainDelay, "check_interval", d.cfg.CheckInterval)
	d.lc.Warn(warnDrainDelay, msg)
}
