package phases

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// offline is what the one-shot commands (`phasegate reclaim` and
// `phasegate decommission`) run on: the daemon's lock, its records and its
// slot manager, opened by the code a start opens them with, and nothing of
// a running daemon (no lifecycle, no port, no metrics).
type offline struct {
	cfg   Config
	log   *slog.Logger
	lock  *lockfile.Lock
	state openedState
	mgr   *slot.Manager
}

// openOffline takes cfg's lock without waiting (a daemon holding it is a
// *SlotsHeldError), then opens the records and the slot manager. Close it.
func openOffline(ctx context.Context, cfg Config, log *slog.Logger) (*offline, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.ensureStateDir(); err != nil {
		return nil, err
	}
	path, err := cfg.LockPath()
	if err != nil {
		return nil, err
	}
	o := &offline{cfg: cfg, log: log}
	if o.lock, err = acquireLock(ctx, cfg, path, 0); err != nil {
		return nil, err
	}
	if o.state, err = openState(cfg, log); err != nil {
		return nil, errors.Join(err, o.Close())
	}
	if o.mgr, err = newManager(ctx, cfg, nil, false, o.state.store.Opened().Generation); err != nil {
		return nil, errors.Join(err, o.Close())
	}
	return o, nil
}

// Close closes the records, then lets the lock go.
func (o *offline) Close() error {
	var err error
	if o.state.store != nil {
		err = o.state.store.Close()
		o.state.store = nil
	}
	return errors.Join(err, o.lock.Unlock())
}

// records reads every record: the indices of the unreadable ones are bad.
func (o *offline) records() ([]leases.Record, []int, error) { return loadRecords(o.state.store) }

// Reclaim tears down, once and without a daemon, the slots no record
// accounts for: leaked by a run that was killed. Leased and recorded idle
// slots are left as they are, exactly as a daemon's start would; in safe
// mode (records lost) so are slots something lives in. It takes the
// daemon's lock, so it refuses to run beside one. The summary says what it
// found; the report what it tore down.
func Reclaim(ctx context.Context, cfg Config, log *slog.Logger) (summary string, rep *reclaim.Report, err error) {
	o, err := openOffline(ctx, cfg, log)
	if err != nil {
		return "", nil, err
	}
	defer o.Close()
	sr, err := o.mgr.Survey(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("scan: %w", err)
	}
	if len(sr.Unreadable) > 0 {
		return "", nil, fmt.Errorf("scan: %w", &slot.UnreadableError{Entries: sr.Unreadable})
	}
	recs, bad, err := o.records()
	if err != nil {
		return "", nil, err
	}
	opened := o.state.store.Opened()
	c := classifier{cfg: cfg, mgr: o.mgr, safeMode: o.state.safeMode, lost: o.state.lost,
		generation: opened.Generation, unvouched: opened.Unvouched, now: time.Now()}
	plan, err := c.classify(ctx, recs, bad, sr.Inventory)
	if err != nil {
		return "", nil, err
	}
	// The held slots are recorded, as a start records them, so that the
	// daemon keeps them; the loss that made them so is then dealt with.
	if err := o.recordHeld(ctx, plan); err != nil {
		return "", nil, err
	}
	if err := c.identifyRestored(plan); err != nil {
		return "", nil, err
	}
	rep, err = reclaim.Slots(ctx, o.mgr, plan.dead, reclaim.Options{
		Workers: cfg.ReclaimWorkers, Budget: cfg.ReclaimBudget, KillOrphans: cfg.ReclaimKillOrphans,
	})
	summary = fmt.Sprintf("%d leased and %d idle slots recorded, left as they are; %d leases lost; %d unknown slots with processes kept",
		len(plan.restored), len(plan.adopted), len(plan.lost), len(plan.held))
	if len(plan.held) > 0 {
		summary += fmt.Sprintf(" (held %v: `phasegate held` adopts or releases them once a daemon runs)", plan.heldIndices())
	}
	if len(plan.bad) > 0 {
		summary += fmt.Sprintf("; %d unreadable records, their slots kept (%v)", len(plan.bad), plan.bad)
	}
	if o.state.safeMode {
		summary += "; safe mode: " + o.state.lost
	}
	if len(plan.restored)+len(plan.adopted) == 0 {
		if kept, ferr := dropEmptyFirewall(ctx, o.mgr); ferr != nil {
			o.log.Warn("removing the firewall table", "error", ferr)
		} else if kept > 0 {
			o.log.Warn("firewall table kept: slots still listed", "slots", kept)
		}
	}
	return summary, rep, err
}

// recordHeld records the slots plan holds, and deletes the stale idle and
// held records, as a start's restore does; then forgets the journal's
// loss, if any.
func (o *offline) recordHeld(ctx context.Context, plan *restorePlan) error {
	st := o.state.store
	if len(plan.stale) > 0 {
		if err := st.Delete(ctx, plan.stale...); err != nil {
			return fmt.Errorf("delete the records of slots gone: %w", err)
		}
	}
	held := plan.unrecordedHeld()
	if len(held) > 0 {
		if err := st.Put(ctx, held...); err != nil {
			return fmt.Errorf("record the held slots: %w", err)
		}
	}
	if o.state.journal != nil {
		if err := st.ClearLoss(ctx); err != nil {
			return err
		}
	}
	return vouch(ctx, st, o.mgr)
}

// LeasesExistError refuses to decommission a host whose slots are leased
// without the confirmation that their workloads may be cut off.
type LeasesExistError struct {
	// Leases names them: "slot 3 (owner sandbox-a)".
	Leases []string
}

func (e *LeasesExistError) Error() string {
	return fmt.Sprintf("%d slots are leased (%s): decommissioning cuts their workloads off; confirm with --destroy-leased-slots",
		len(e.Leases), strings.Join(e.Leases, ", "))
}

// DecommissionResult says what Decommission did: the teardown of the
// slots, and what it removed from and left in the state directory.
type DecommissionResult struct {
	// Teardown is what the teardown of the slots did.
	Teardown *slot.TeardownResult
	// FirewallRemoved: the nftables table is gone.
	FirewallRemoved bool
	// Removed are the files removed from the state directory: the records
	// (slots.db) and the copies taken before schema upgrades.
	Removed []string
	// KeptAside are unusable state files an earlier start moved aside for
	// inspection: they are an operator's evidence, so they are kept (and
	// while one is there a start in this state directory restores in safe
	// mode; see the state file's doc).
	KeptAside []string
}

// String is a one-line summary for the command's output.
func (r *DecommissionResult) String() string {
	var b strings.Builder
	if r.Teardown != nil {
		b.WriteString(r.Teardown.String())
		b.WriteString("; ")
	}
	if r.FirewallRemoved {
		b.WriteString("firewall table removed; ")
	} else {
		b.WriteString("firewall table kept; ")
	}
	if len(r.Removed) > 0 {
		b.WriteString("removed " + strings.Join(r.Removed, ", "))
	} else {
		b.WriteString("records kept")
	}
	if len(r.KeptAside) > 0 {
		b.WriteString("; kept for inspection, remove by hand: " + strings.Join(r.KeptAside, ", "))
	}
	return b.String()
}

// Decommission destroys every slot of the configuration, leased ones
// included, the firewall table and the records: the state file and its
// pre-upgrade copies are removed, so that the state directory holds
// nothing of this configuration but unusable files kept aside for
// inspection (listed in the result). It takes the daemon's lock, so it
// refuses to run beside one, and refuses with a *[LeasesExistError] while
// leases exist unless destroyLeased confirms it. The lock file stays in
// the lock directory, unlocked: removing it would let a waiter lock a file
// a newcomer then replaces (see lockfile.Lock.Unlock).
func Decommission(ctx context.Context, cfg Config, destroyLeased bool, log *slog.Logger) (*DecommissionResult, error) {
	o, err := openOffline(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	defer o.Close()
	recs, _, err := o.records()
	if err != nil {
		return nil, err
	}
	var leased []string
	for _, r := range recs {
		switch r.State {
		case leases.Leased:
			leased = append(leased, fmt.Sprintf("slot %d (owner %s)", r.Index, names.Shown(r.Owner)))
		case leases.Held:
			// Something lives in it and may be a tenant's.
			leased = append(leased, fmt.Sprintf("slot %d (held: %s)", r.Index, r.HeldReason))
		}
	}
	if len(leased) > 0 && !destroyLeased {
		return nil, &LeasesExistError{Leases: leased}
	}
	inv, err := o.mgr.Scan(ctx)
	if err != nil {
		return nil, fmt.Errorf("scan: %w", err)
	}
	// Processes inside are cut off, not killed (unless
	// --reclaim-kill-orphans): they belong to the workloads, not to us.
	// The slots' elements and egress chains go with the table below, in
	// its one transaction, rather than slot by slot first.
	opts := cfg.teardownOptions()
	opts.TableGoes = true
	res := &DecommissionResult{Teardown: o.mgr.Teardown(ctx, inv, opts)}
	if err := res.Teardown.Err(); err != nil {
		// The records of what is left are kept: a later run finds it.
		return res, fmt.Errorf("decommission: %w", err)
	}
	if err := o.mgr.Firewall().Delete(ctx); err != nil {
		return res, fmt.Errorf("decommission: %w", err)
	}
	res.FirewallRemoved = true
	// The records go last, once nothing they describe is left; the lock
	// is still held, so no daemon opens the file meanwhile.
	store := o.state.store
	o.state.store = nil
	if err := store.Close(); err != nil {
		return res, fmt.Errorf("decommission: close the records: %w", err)
	}
	path := cfg.StatePath()
	res.Removed, err = leases.Remove(path)
	if err != nil {
		return res, fmt.Errorf("decommission: %w", err)
	}
	// The start history and the host check's record describe a daemon
	// that is no more.
	for _, name := range []string{HistoryFileName, hostCheckedName} {
		file := filepath.Join(cfg.StateDir, name)
		switch err := os.Remove(file); {
		case err == nil:
			res.Removed = append(res.Removed, file)
		case !errors.Is(err, os.ErrNotExist):
			return res, fmt.Errorf("decommission: %w", err)
		}
	}
	res.KeptAside = leases.KeptAside(path).All()
	return res, nil
}
