package phases

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// restorePlan is what the reclaim phase decided for every slot it found on
// the host or in the records (DESIGN.md, section 6):
//
//	found                     record                       decision
//	anything                  leased                       restored, VERIFYING: checked after SERVING (verifyLeases)
//	intact, identity matches  idle                         adopted into the warm pool
//	anything                  none, identity differs       dead: reclaimed
//	anything                  leased beyond --slots        lost: reported; the record stays
//	something lives in it     none (records lost)          held: quarantined and reported, never destroyed
//
// A restored lease's slot is what its record says until it is verified:
// then it is restored (same owner; only the host side repaired) or lost
// (reported; the index stays the lease's, what was at it torn down).
type restorePlan struct {
	restored []*lease       // leases to verify, with a fresh full TTL
	found    slot.Inventory // what the scan found at the restored leases' indices
	lost     []*lease       // leases this configuration cannot serve
	adopted  []*slot.Slot   // idle slots, for the warm pool
	dead     slot.Inventory // what is on the host and belongs to nobody
	held     []int          // unknown slots something lives in (safe mode)
	bad      []int          // indices whose record cannot be read
	stale    []int          // idle records whose slot is gone: deleted
}

// String is the start log's summary.
func (p *restorePlan) String() string {
	return fmt.Sprintf("restored %d leases (verified after serving), adopted %d idle slots, reclaimed %d, lost %d",
		len(p.restored), len(p.adopted), len(p.dead), len(p.lost))
}

// classify matches the records with what is on the host. It reads the host
// and the records and changes nothing. A leased record costs no system
// call here: its slot is checked after SERVING (verifyLeases); an idle
// one is checked now (there are as many as the pool holds).
func (d *Daemon) classify(ctx context.Context, recs []leases.Record, bad []int, inv slot.Inventory) (*restorePlan, error) {
	p := &restorePlan{dead: slot.Inventory{}, found: slot.Inventory{}, bad: bad}
	recorded := map[int]bool{}
	for _, i := range bad {
		recorded[i] = true // neither reclaimed nor handed out: quarantined
	}
	for _, rec := range recs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		recorded[rec.Index] = true
		if !d.cfg.withinSlots(rec.Index) {
			// Recorded by a run with more slots: a lease there cannot be
			// served by this configuration, but must not be destroyed.
			if rec.State == leases.Leased {
				p.lost = append(p.lost, &lease{rec: rec, lostReason: fmt.Sprintf("slot %d is beyond --slots %d", rec.Index, d.cfg.Slots.Slots)})
			} else {
				p.stale = append(p.stale, rec.Index)
				if r, ok := inv[rec.Index]; ok {
					p.dead[rec.Index] = r
				}
			}
			continue
		}
		if rec.State == leases.Leased {
			p.restored = append(p.restored, &lease{rec: rec, slot: recordedSlot(d.cfg.Slots, rec), check: newLeaseCheck()})
			if r, ok := inv[rec.Index]; ok {
				p.found[rec.Index] = r
			}
			continue
		}
		sl, err := d.mgr.Identify(rec.Index, rec.Netns, rec.HostIfindex)
		if err != nil && !errors.Is(err, slot.ErrGone) {
			return nil, err
		}
		switch {
		case err == nil:
			p.adopted = append(p.adopted, sl)
		default:
			p.stale = append(p.stale, rec.Index)
			if r, ok := inv[rec.Index]; ok {
				p.dead[rec.Index] = r
			}
		}
	}
	for i, r := range inv {
		if !recorded[i] {
			p.dead[i] = r
		}
	}
	if d.safeMode && len(p.dead) > 0 {
		// The records are lost: a slot something lives in may be a
		// workload's. Quarantine it rather than cut it off.
		held, err := inhabited(p.dead, d.cfg.Slots)
		if err != nil {
			return nil, err
		}
		for _, i := range held {
			delete(p.dead, i)
		}
		p.held = held
	}
	slices.SortFunc(p.restored, func(a, b *lease) int { return a.rec.Index - b.rec.Index })
	slices.SortFunc(p.lost, func(a, b *lease) int { return a.rec.Index - b.rec.Index })
	slices.SortFunc(p.adopted, func(a, b *slot.Slot) int { return a.Index - b.Index })
	return p, nil
}

// recordedSlot is the slot rec says is at its index, to be verified.
func recordedSlot(cfg slot.Config, rec leases.Record) *slot.Slot {
	s := cfg.Slot(rec.Index)
	s.NetnsID, s.HostIfIndex = rec.Netns, rec.HostIfindex
	return &s
}

// identifyRestored checks the restored leases of p at once, for a
// one-shot reclaim with no daemon to serve: a lease whose slot is gone
// moves to the lost ones, and what is at its index to the dead.
func (d *Daemon) identifyRestored(p *restorePlan) error {
	var intact []*lease
	for _, l := range p.restored {
		_, err := d.mgr.Identify(l.rec.Index, l.rec.Netns, l.rec.HostIfindex)
		switch {
		case err == nil:
			intact = append(intact, l)
		case errors.Is(err, slot.ErrGone):
			p.lost = append(p.lost, &lease{rec: l.rec, lostReason: err.Error()})
			if r, ok := p.found[l.rec.Index]; ok {
				p.dead[l.rec.Index] = r // what is there now is not the lease's
			}
		default:
			return err
		}
	}
	p.restored = intact
	slices.SortFunc(p.lost, func(a, b *lease) int { return a.rec.Index - b.rec.Index })
	return nil
}

// inhabited returns the slots of inv whose namespace a process lives in or
// holds a descriptor on, from one scan of /proc.
func inhabited(inv slot.Inventory, cfg slot.Config) ([]int, error) {
	// A scan that could not read some processes (pid 1 in some
	// sandboxes) still says where the others live; what it could not read
	// is reported by the teardown that follows.
	var incomplete *netns.IncompleteError
	procs, err := netns.ScanProcesses()
	if err != nil && !errors.As(err, &incomplete) {
		return nil, fmt.Errorf("safe mode: scan processes: %w", err)
	}
	holders, err := netns.ScanHolders()
	if err != nil && !errors.As(err, &incomplete) {
		return nil, fmt.Errorf("safe mode: scan descriptor holders: %w", err)
	}
	var out []int
	for _, i := range slices.Sorted(maps.Keys(inv)) {
		if inv[i]&slot.HasNetns == 0 {
			continue
		}
		id, err := netns.Stat(cfg.NetnsPath(i))
		if err != nil {
			continue // not a bound namespace: nothing can live in it
		}
		if len(procs[id]) > 0 || len(holders[id]) > 0 {
			out = append(out, i)
		}
	}
	return out, nil
}

// renewLeases gives every lease a fresh full TTL (what etcd does after a
// leader change: owners get a whole TTL to reconnect) and records that,
// and deletes stale idle records, in one transaction each: the records
// stay the truth, so a crash at any point of the verification that follows
// leaves the next start the same work.
func (d *Daemon) renewLeases(ctx context.Context, p *restorePlan, now time.Time) error {
	var recs []leases.Record
	for _, l := range slices.Concat(p.restored, p.lost) {
		if l.rec.TTL > 0 {
			l.rec.Expires = now.Add(l.rec.TTL)
			recs = append(recs, l.rec)
		}
	}
	if len(recs) > 0 {
		if err := d.store.Put(ctx, recs...); err != nil {
			return fmt.Errorf("renew restored leases: %w", err)
		}
	}
	if len(p.stale) > 0 {
		if err := d.store.Delete(ctx, p.stale...); err != nil {
			return fmt.Errorf("delete the records of slots gone: %w", err)
		}
	}
	return nil
}

// logPlan says what the restore found, a line per restored lease whose host
// side needed repair and per lost lease.
func (d *Daemon) logPlan(p *restorePlan) {
	attrs := []any{"restored", len(p.restored), "adopted", len(p.adopted), "reclaim", len(p.dead), "lost", len(p.lost)}
	if len(p.held) > 0 {
		attrs = append(attrs, "held", len(p.held))
	}
	if len(p.bad) > 0 {
		attrs = append(attrs, "unreadable_records", len(p.bad))
	}
	d.log.Info("restore: "+p.String(), attrs...)
	for _, l := range p.lost {
		d.log.Warn("lease lost across the restart", "slot", l.rec.Index, "owner", l.rec.Owner, "reason", l.lostReason)
	}
	if len(p.held) > 0 {
		d.log.Warn("safe mode: slots with processes inside are kept, quarantined, and reported: they may be leased",
			"slots", fmt.Sprint(p.held))
	}
	if len(p.bad) > 0 {
		d.log.Error("unreadable records: their slots are quarantined", "slots", fmt.Sprint(p.bad))
	}
}

// Verifying the restored leases after SERVING (DESIGN.md section 6).
const (
	// verifyWorkers bounds the slots checked at once: each check is a
	// stat, two ioctls and a netlink request the kernel serialises
	// (BenchmarkVerifyRestored: 4, 8 or 16 workers are no faster than 2,
	// and 2 a little faster than 1; docs/BENCHMARKS.md). Two leave a core
	// to serving on a small machine.
	verifyWorkers = 2
	// verifyBatch is how many leases the background verification claims
	// at a time: a Release of one of them waits for its batch, and each
	// batch adds its missing firewall elements in one transaction.
	verifyBatch = 64
	// verifyRetries bounds the passes over leases whose check found
	// nothing certain (a netlink error), verifyBackoff spaces them.
	verifyRetries = 3
	verifyBackoff = time.Second
)

// verifyLeases verifies every restored lease in the background, batch by
// batch, while /health says warn with the progress. A lease found lost is
// reported at once (reportLost). A drain stops it between batches: the
// records are untouched by a check, so the next start verifies what is
// left the same way.
func (d *Daemon) verifyLeases(ctx context.Context, p *lifecycle.Progress, ls []*lease) error {
	total := len(ls)
	start := time.Now()
	d.lc.Warn(taskVerify, fmt.Sprintf("verifying %d restored leases in the background", total))
	defer d.lc.ClearWarning(taskVerify)
	p.SetTotal(int64(total), "leases")
	var err error
	for pass := range verifyRetries {
		if pass > 0 {
			select {
			case <-time.After(verifyBackoff):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		err = nil
		for chunk := range slices.Chunk(ls, verifyBatch) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			_, cerr := d.slots.verifyRestored(ctx, chunk)
			err = cmp.Or(err, cerr)
			left, _ := d.slots.outcome(ls)
			p.SetDone(int64(total - left))
		}
		if err == nil {
			break
		}
		d.log.Warn("restored leases: some could not be verified; trying again", "pass", pass+1, "error", err)
	}
	left, lost := d.slots.outcome(ls)
	d.log.Info("restored leases verified", "leases", total, "intact", total-left-lost, "lost", lost, "unverified", left,
		"duration", time.Since(start).Round(time.Millisecond).String())
	if left > 0 {
		return fmt.Errorf("%d restored leases could not be verified: %w", left, err)
	}
	return nil
}

// verify checks restored slots against their records and repairs their
// host side (leaseVerifier): the namespace and host link identity, the
// link up and its address, the firewall element (one transaction for
// all); what was at a lost lease's index is torn down, so that the index
// is clean for whoever gets it after the lease. Every step is idempotent:
// a crash leaves the next start the same steps to take.
func (d *Daemon) verify(ctx context.Context, slots []*slot.Slot) []verdict {
	out, fixed := d.checkSlots(slots, verifyWorkers)
	var missing []string
	var missingAt []int
	lostObjects := slot.Inventory{}
	for i, sl := range slots {
		switch {
		case out[i].err != nil:
		case out[i].lost != "":
			if r, ok := d.plan.found[sl.Index]; ok {
				lostObjects[sl.Index] = r
			}
		case d.plan.found[sl.Index]&slot.HasElement == 0:
			missing, missingAt = append(missing, sl.HostIf), append(missingAt, i)
			fixed[i] = append(fixed[i], "firewall element")
		}
	}
	if len(missing) > 0 {
		if err := d.mgr.Firewall().Add(ctx, missing...); err != nil {
			for _, i := range missingAt {
				out[i].err = fmt.Errorf("restore lease of slot %d: %w", slots[i].Index, err)
			}
		}
	}
	if len(lostObjects) > 0 {
		if err := d.mgr.Teardown(ctx, lostObjects, d.teardownOptions()).Err(); err != nil {
			for i, sl := range slots {
				if _, ok := lostObjects[sl.Index]; ok {
					out[i] = verdict{err: fmt.Errorf("clear the index of a lost lease: %w", err)}
				}
			}
		}
	}
	d.countVerdicts(slots, out, fixed)
	return out
}

// checkSlots runs verifyOne on every slot, workers at a time.
func (d *Daemon) checkSlots(slots []*slot.Slot, workers int) ([]verdict, [][]string) {
	out := make([]verdict, len(slots))
	fixed := make([][]string, len(slots))
	var g errgroup.Group
	g.SetLimit(workers)
	for i, sl := range slots {
		g.Go(func() error {
			out[i], fixed[i] = d.verifyOne(sl)
			return nil
		})
	}
	_ = g.Wait() // every check's outcome is in out
	return out, fixed
}

// verifyOne checks one restored slot and repairs its host side: what it
// repaired, or why the lease is lost, or what kept it from telling.
func (d *Daemon) verifyOne(sl *slot.Slot) (verdict, []string) {
	found, err := d.mgr.Identify(sl.Index, sl.NetnsID, sl.HostIfIndex)
	if err == nil {
		var fixed []string
		if fixed, err = d.mgr.RepairHost(found); err == nil {
			return verdict{}, fixed
		}
	}
	if errors.Is(err, slot.ErrGone) {
		return verdict{lost: err.Error()}, nil
	}
	return verdict{err: fmt.Errorf("restore lease of slot %d: %w", sl.Index, err)}, nil
}

// countVerdicts logs each restored lease whose host side needed repair and
// counts the outcomes.
func (d *Daemon) countVerdicts(slots []*slot.Slot, out []verdict, fixed [][]string) {
	intact, lost := 0, 0
	for i, sl := range slots {
		switch {
		case out[i].err != nil:
		case out[i].lost != "":
			lost++
		default:
			intact++
			if len(fixed[i]) > 0 {
				d.log.Info("restored lease: host side repaired, nothing inside touched", "slot", sl.Index, "repaired", strings.Join(fixed[i], ", "))
			}
		}
	}
	d.obs.verified(intact, lost)
}

// reportLost says that leases were found lost (leaseVerifier), the moment
// their state says LOST: a log line each and the health warning, which
// names every lease lost since the start.
func (d *Daemon) reportLost(lost []leases.Record, reasons []string) {
	for i, rec := range lost {
		d.log.Warn("lease lost across the restart", "slot", rec.Index, "owner", rec.Owner, "reason", reasons[i])
	}
	d.mu.Lock()
	for _, rec := range lost {
		d.lostSlots = append(d.lostSlots, rec.Index)
	}
	slices.Sort(d.lostSlots)
	// Under d.mu: two batches' warnings must not overtake each other.
	d.lc.Warn(warnLeasesLost, lostMessage(d.lostSlots))
	d.mu.Unlock()
}

// lostMessage is the leases-lost warning.
func lostMessage(slots []int) string {
	return fmt.Sprintf("%d leases lost across the restart (slots %v): their namespace or host link was gone or made again; owners see why in Get", len(slots), slots)
}
