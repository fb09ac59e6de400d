package phases

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/lease"
)

// openStore opens the records once the lock is held: only the holder of
// the slots may read and change what they are. It is the reclaim phase's
// first step rather than the lock's, so that the port binds while the
// file is opened and checked.
func (d *Daemon) openStore() error {
	st, err := openState(d.cfg, d.log)
	if err != nil {
		return lifecycle.Permanent(err)
	}
	d.store, d.lost.safeMode, d.lost.why, d.lost.journal = st.store, st.safeMode, st.lost, st.journal
	d.state.opened()
	if d.lost.why != "" {
		d.lc.Warn(warnStateLost, d.lost.why+lossNamed(st.journal)+"; slots something lives in are kept and quarantined")
	}
	return nil
}

// readStart is what the reclaim phase reads before it changes anything:
// the scan of the host, the records and, when the host check did not read
// them before the port, the host's addresses: independent reads run at
// once, so that the phase waits for the longest rather than their sum. The scan is the package's read-only one (the
// manager, which makes the firewall table, comes after). Records are read
// beside the scan only when their file exists: a first start has none to
// read, and a start whose scan failed must not leave a state file it made.
func (d *Daemon) readStart(ctx context.Context) (_ *slot.ScanResult, recs []leases.Record, bad []int, err error) {
	var (
		wg                 sync.WaitGroup
		recordErr, hostErr error
	)
	_, statErr := os.Lstat(d.cfg.StatePath())
	loadAfter := d.store == nil && errors.Is(statErr, fs.ErrNotExist)
	if !loadAfter {
		wg.Go(func() { recs, bad, recordErr = d.loadRecords() })
	}
	if d.mgr == nil && !d.host.read {
		wg.Go(func() { hostErr = d.readHostAddrs() })
	}
	var sr *slot.ScanResult
	if d.mgr != nil {
		sr, err = d.mgr.Survey(ctx)
	} else {
		sr, err = slot.Survey(ctx, d.cfg.Slots)
	}
	wg.Wait()
	if err != nil {
		err = fmt.Errorf("scan: %w", err)
	}
	if loadAfter && err == nil {
		recs, bad, recordErr = d.loadRecords()
	}
	if err := errors.Join(err, recordErr, hostErr); err != nil {
		return nil, nil, nil, err
	}
	return sr, recs, bad, nil
}

// readHostAddrs reads the host's own addresses for the egress defaults
// when the host check, which reads them too, did not run before the port
// (an upgrade's new image, a restart that checks after its port): one
// address dump, beside the scan.
func (d *Daemon) readHostAddrs() error {
	addrs, err := d.cfg.Slots.HostAddrs()
	if err != nil {
		return fmt.Errorf("the host's addresses: %w", err)
	}
	d.host.addrs, d.host.read = addrs, true
	return nil
}

// loadRecords opens the records (once) and reads them: the indices of
// the unreadable ones are bad, sorted.
func (d *Daemon) loadRecords() ([]leases.Record, []int, error) {
	if d.store == nil {
		if err := d.openStore(); err != nil {
			return nil, nil, err
		}
	}
	recs, bad, err := loadRecords(d.store)
	if err != nil {
		return nil, nil, lifecycle.Permanent(err)
	}
	return recs, bad, nil
}

// loadRecords reads every record of store: the indices of the unreadable
// ones are bad, sorted.
func loadRecords(store *leases.Store) ([]leases.Record, []int, error) {
	recs, err := store.Load()
	var bad []int
	if re := (*leases.RecordsError)(nil); errors.As(err, &re) {
		for i := range re.Bad {
			bad = append(bad, i)
		}
		slices.Sort(bad)
	} else if err != nil {
		return nil, nil, fmt.Errorf("load the records: %w", err)
	}
	return recs, bad, nil
}

// newManager makes the slot manager, which writes the slot table: its
// rules, and the egress defaults of every lease's policy, resolved here
// once (egressDefaults) with the host's addresses the host check (New)
// read, or read now when it did not run.
func (d *Daemon) newManager(ctx context.Context) (*slot.Manager, error) {
	return newManager(ctx, d.cfg, d.host.addrs, d.host.read, d.store.Opened().Generation)
}

// newManager makes cfg's slot manager, which stamps the slots it makes
// with stamp (the records' generation); hostAddrs are the host's own
// addresses, when read.
func newManager(ctx context.Context, cfg Config, hostAddrs []netip.Prefix, read bool, stamp string) (*slot.Manager, error) {
	egress, err := egressDefaults(cfg, hostAddrs, read)
	if err != nil {
		return nil, lifecycle.Permanent(fmt.Errorf("egress policy defaults: %w", err))
	}
	o := slot.DefaultOptions()
	o.Firewall, o.Egress, o.Stamp = cfg.Firewall, egress, stamp
	return slot.NewManager(ctx, cfg.Slots, o)
}

// teardownOptions are the settings of every teardown but the start's.
func (c Config) teardownOptions() slot.TeardownOptions {
	return slot.TeardownOptions{Workers: c.ReclaimWorkers, KillOrphans: c.ReclaimKillOrphans}
}

// runReclaim is the critical path of a restart: check that the host uses
// nothing of the slot CIDR, scan what is on the host and read the records
// (readStart, before anything is changed), match the two, restore the leases whose slots are intact
// (touching nothing inside them), adopt the idle ones, and decide what is
// dead. The dead are reclaimed here only with --reclaim=foreground; by
// default they are reclaimed in the background once the warm slots are
// made, so that serving never waits on the kernel's clean-up of the dead.
func (d *Daemon) runReclaim(ctx context.Context, p *lifecycle.Progress) error {
	start := time.Now()
	p.SetMessage("scanning")
	sr, recs, bad, err := d.readStart(ctx)
	if err != nil {
		return err
	}
	inv := sr.Inventory
	scanned := time.Since(start)
	if d.mgr == nil {
		mgr, err := d.newManager(ctx)
		if err != nil {
			return err
		}
		mgr.Surveyed(sr)
		d.mgr = mgr
	}
	d.noteScan(sr)
	plan, err := d.classifier().classify(ctx, recs, bad, inv)
	if err != nil {
		return err
	}
	d.records = lease.NewRecords(d.store, d.log, lease.RecordedIndices(recs, bad)...)
	d.records.OnWrite = d.state.wrote
	if err := d.renewLeases(ctx, plan, time.Now()); err != nil {
		return err
	}
	if d.lost.journal != nil {
		// The held slots are recorded: a later start keeps them without
		// the loss.
		if err := d.store.ClearLoss(ctx); err != nil {
			return fmt.Errorf("forget the journal's loss once the slots are held: %w", err)
		}
	}
	if err := vouch(ctx, d.store, d.mgr); err != nil {
		return err
	}
	d.plan = plan
	d.held = lease.NewHeldSlots(d.lc, plan.held)
	d.announcePlan(ctx, plan, scanned)
	if !d.cfg.reclaimInForeground() || len(plan.dead) == 0 {
		p.SetMessage(plan.String())
		return nil
	}
	return d.reclaimForeground(ctx, p, plan, sr, scanned)
}

// noteScan notes what the start's scan could not inspect (quarantined)
// and what it found beyond --slots.
func (d *Daemon) noteScan(sr *slot.ScanResult) {
	d.unreadable = sr.Unreadable
	for _, u := range sr.Unreadable {
		d.log.Warn("netns entry could not be inspected: neither reclaimed nor handed out, quarantined", "slot", u.Index, "name", u.Name, "error", u.Err)
	}
	d.obs.unreadable(len(sr.Unreadable))
	if len(sr.Beyond) > 0 {
		d.log.Info("slots beyond --slots found (a run with more slots left them): reclaimed unless leased", "slots", fmt.Sprint(sr.Beyond))
	}
}

// announcePlan says what the restore decided: in health, the log, the
// metrics and the phase's span.
func (d *Daemon) announcePlan(ctx context.Context, plan *restorePlan, scanned time.Duration) {
	d.reportUnvouched(plan)
	d.logPlan(plan)
	d.obs.restored(plan)
	trace.SpanFromContext(ctx).SetAttributes(
		attribute.Int("phasegate.restore.leases", len(plan.restored)),
		attribute.Int("phasegate.restore.adopted", len(plan.adopted)),
		attribute.Int("phasegate.restore.reclaim", len(plan.dead)),
		attribute.Int("phasegate.restore.lost", len(plan.lost)),
		attribute.Int("phasegate.restore.held", len(plan.held)),
		attribute.Int("phasegate.restore.uncertain", len(plan.uncertain)),
		attribute.String("phasegate.restore.scan", scanned.String()),
	)
	if len(plan.lost) > 0 {
		// logPlan named each; the check of the restored leases adds to
		// this list what it finds lost.
		d.lc.Warn(warnLeasesLost, lease.LostMessage(plan.lostIndices()))
	}
}

// reclaimForeground reclaims the dead slots of plan before the daemon
// serves (--reclaim=foreground), within --reclaim-budget.
func (d *Daemon) reclaimForeground(ctx context.Context, p *lifecycle.Progress, plan *restorePlan, sr *slot.ScanResult, scanned time.Duration) error {
	p.SetTotal(int64(len(plan.dead)), "namespaces")
	opts := reclaim.Options{
		Workers:     d.cfg.ReclaimWorkers,
		Budget:      d.cfg.ReclaimBudget,
		KillOrphans: d.cfg.ReclaimKillOrphans,
		Progress:    teardownProgress(p),
	}
	rep, err := reclaim.Slots(ctx, d.mgr, plan.dead, opts)
	if err != nil {
		return err
	}
	rep.Scan, rep.Unreadable = scanned, sr.Unreadable
	p.SetDone(int64(len(rep.Reclaimed)))
	d.report = rep
	d.obs.reclaimed(rep)
	d.logReport(rep)
	return nil
}

// classifier is the restore's classifier.
func (d *Daemon) classifier() classifier {
	o := d.store.Opened()
	c := classifier{cfg: d.cfg, mgr: d.mgr, safeMode: d.lost.safeMode, lost: d.lost.why,
		generation: o.Generation, unvouched: o.Unvouched, now: time.Now()}
	if d.lost.journal != nil {
		c.hints = map[int]leases.LostChange{}
		for _, n := range d.lost.journal.Named {
			if n.Owner != "" {
				c.hints[n.Index] = n
			}
		}
	}
	return c
}

// reportUnvouched says in health what this start found that the records
// could not vouch for: why (safe mode's reason, or slots made under
// records that are gone), the slots held, and those reclaimed with
// nothing inside, whose leases, if they had one, are lost.
func (d *Daemon) reportUnvouched(p *restorePlan) {
	if !d.lost.safeMode && len(p.uncertain) == 0 && len(p.heldNow) == 0 {
		return
	}
	msg := d.lost.why + lossNamed(d.lost.journal)
	if !d.lost.safeMode {
		msg = "slots made under records that are gone (the firewall table's stamp sets name another store than " + d.store.Opened().Generation + ")"
	}
	msg += fmt.Sprintf("; held, something lives in them: slots %v; reclaimed, nothing inside, a lease they carried is lost: slots %v",
		p.heldNow, p.uncertain)
	d.lc.Warn(warnStateLost, msg)
}

// vouch ends a new store's check of the slots against other records once
// the slots it held are recorded: the other records' stamp sets are
// dropped, and the store says it is vouched for, so that later starts read
// no stamps. A start killed before does it again.
func vouch(ctx context.Context, store *leases.Store, mgr *slot.Manager) error {
	if !store.Opened().Unvouched {
		return nil
	}
	if err := mgr.DropOtherStamps(ctx); err != nil {
		return fmt.Errorf("forget the stamps of other records once the slots are held: %w", err)
	}
	if err := store.Vouched(ctx); err != nil {
		return fmt.Errorf("record that the slots were checked against other records: %w", err)
	}
	return nil
}

// lossNamed names what a lost journal still told, for the health warning.
func lossNamed(l *leases.JournalLoss) string {
	if l == nil || len(l.Named) == 0 {
		return ""
	}
	return "; it still names " + namedLoss(l.Named)
}

// Messages of a teardown's progress: the count is of namespaces unlinked,
// and once it is complete the teardown still waits for the kernel to
// destroy them (their host links to vanish), which can take seconds.
const (
	msgUnlinking  = "unlinking"
	msgKernelWait = "all unlinked; waiting for the kernel to destroy them"
)

// teardownProgress is a reclaim's Progress callback that keeps p's count
// and its message saying the step under way: an earlier step's message
// (the scan's) would claim a step that is over.
func teardownProgress(p *lifecycle.Progress) func(done, total int) {
	p.SetMessage(msgUnlinking)
	return func(done, total int) {
		p.SetDone(int64(done))
		if done == total {
			p.SetMessage(msgKernelWait)
		}
	}
}

// stopFirewall removes the daemon's nftables table once no slot is left in
// it, so a clean stop leaves nothing behind. A stop keeps the leased and
// warm slots for the next start, and their table with them: that is the
// design, logged at Info (a teardown that failed warns where it failed).
func (d *Daemon) stopFirewall(ctx context.Context) error {
	kept, err := dropEmptyFirewall(ctx, d.mgr)
	if kept > 0 {
		d.log.Info("firewall table kept for the slots left to the next start", "table", d.mgr.Firewall().Name(), "slots", kept)
	}
	return err
}

// dropEmptyFirewall deletes m's nftables table if its set lists no slot,
// and otherwise returns how many it lists: a table that still names slots
// (stuck ones) stays for the next reclaim.
func dropEmptyFirewall(ctx context.Context, m *slot.Manager) (kept int, err error) {
	fw := m.Firewall()
	names, err := fw.List(ctx)
	if err != nil {
		return 0, fmt.Errorf("list firewall set: %w", err)
	}
	if len(names) > 0 {
		return len(names), nil
	}
	return 0, fw.Delete(ctx)
}

func (d *Daemon) logReport(rep *reclaim.Report) {
	attrs := []any{
		"found", rep.Found, "reclaimed", len(rep.Reclaimed), "failed", len(rep.Failed),
		"deferred", len(rep.Deferred), "orphans", len(rep.Orphans), "cut_off", len(rep.CutOff),
		"duration", rep.Duration.Round(time.Millisecond).String(),
		// Where the time went: the scan of what exists, the /proc scan for
		// processes and holders, detach+unlink, the wait for the kernel to
		// drop the host links, the one nftables transaction.
		"scan", rep.Scan.Round(time.Millisecond).String(),
		"procs", rep.Timings.Procs.Round(time.Millisecond).String(),
		"unlink", rep.Timings.Unlink.Round(time.Millisecond).String(),
		"wait", rep.Timings.Wait.Round(time.Millisecond).String(),
		"firewall", rep.Timings.Firewall.Round(time.Millisecond).String(),
	}
	if rep.Duration > 0 && len(rep.Reclaimed) > 0 {
		attrs = append(attrs, "rate_per_s", int(float64(len(rep.Reclaimed))/rep.Duration.Seconds()))
	}
	if len(rep.Beyond) > 0 {
		attrs = append(attrs, "beyond", len(rep.Beyond))
	}
	if rep.Batches > 1 {
		attrs = append(attrs, "batches", rep.Batches)
	}
	d.log.Info("reclaim report", attrs...)
	d.logTeardownProblems(rep.Failed, rep.Orphans, rep.ProcScan, rep.WaitErr)
}

// logTeardownProblems logs what a teardown could not do or see: each
// failed slot, each process found inside a leaked namespace, and what kept
// the teardown from seeing everything (a /proc scan that could not read
// every process, a failed wait for the kernel).
func (d *Daemon) logTeardownProblems(failed []slot.Failure, orphans []slot.Orphan, procScan, waitErr error) {
	for _, f := range failed {
		d.log.Warn("slot teardown failed; quarantined for the reconciler", "slot", f.Index, "error", f.Err)
	}
	for _, o := range orphans {
		attrs := []any{"slot", o.Index, "pid", o.PID, "comm", o.Comm, "killed", o.Killed}
		if o.Gone {
			attrs = append(attrs, "gone", true)
		}
		if o.Err != nil {
			attrs = append(attrs, "error", o.Err)
		}
		d.log.Warn("process inside a leaked namespace", attrs...)
	}
	if procScan != nil {
		msg := procScan.Error()
		d.mu.Lock()
		seen := d.procScanSeen[msg]
		if d.procScanSeen == nil {
			d.procScanSeen = map[string]bool{}
		}
		d.procScanSeen[msg] = true
		d.mu.Unlock()
		if !seen { // the same process is unreadable at every pass
			d.log.Warn("process scan incomplete: namespaces of the processes it could not read are treated as held", "error", msg)
		}
	}
	if waitErr != nil {
		d.log.Warn("waiting for the kernel to remove host links failed; the links left were deleted", "error", waitErr)
	}
}
