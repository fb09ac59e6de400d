package phases

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// restorePlan is what the reclaim phase decided for every slot it found on
// the host or in the records (DESIGN.md, section 5b):
//
//	found                     record                       decision
//	intact, identity matches  leased                       restored: same owner; only the host side repaired
//	intact, identity matches  idle                         adopted into the warm pool
//	anything                  none, identity differs       dead: reclaimed
//	nothing, or not the same  leased                       lost: reported; the index stays the lease's
//	something lives in it     none (records lost)          held: quarantined and reported, never destroyed
type restorePlan struct {
	restored []*lease       // leases whose slot is intact, with a fresh full TTL
	lost     []*lease       // leases whose slot is gone or not the one leased
	adopted  []*slot.Slot   // idle slots, for the warm pool
	dead     slot.Inventory // what is on the host and belongs to nobody
	held     []int          // unknown slots something lives in (safe mode)
	bad      []int          // indices whose record cannot be read
	stale    []int          // idle records whose slot is gone: deleted
	repaired map[int][]string
}

// String is the start log's summary.
func (p *restorePlan) String() string {
	return fmt.Sprintf("restored %d leases, adopted %d idle slots, reclaimed %d, lost %d",
		len(p.restored), len(p.adopted), len(p.dead), len(p.lost))
}

// classify matches the records with what is on the host. It reads the host
// and the records and changes nothing.
func (d *Daemon) classify(ctx context.Context, recs []leases.Record, bad []int, inv slot.Inventory, now time.Time) (*restorePlan, error) {
	p := &restorePlan{dead: slot.Inventory{}, repaired: map[int][]string{}, bad: bad}
	recorded := map[int]bool{}
	for _, i := range bad {
		recorded[i] = true // neither reclaimed nor handed out: quarantined
	}
	for _, rec := range recs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		recorded[rec.Index] = true
		if rec.Index > d.cfg.Slots.Slots {
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
		sl, err := d.mgr.Identify(rec.Index, rec.Netns, rec.HostIfindex)
		same := err == nil
		var why string
		switch {
		case errors.Is(err, slot.ErrGone):
			why = err.Error()
		case err != nil:
			return nil, err
		}
		switch {
		case rec.State == leases.Leased && same:
			p.restored = append(p.restored, &lease{rec: rec, slot: sl})
		case rec.State == leases.Leased:
			p.lost = append(p.lost, &lease{rec: rec, lostReason: why})
			if r, ok := inv[rec.Index]; ok {
				p.dead[rec.Index] = r // what is there now is not the lease's
			}
		case same:
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

// restoreLeases repairs the host side of the restored leases, gives every
// one a fresh full TTL (what etcd does after a leader change: owners get a
// whole TTL to reconnect) and records that, deletes stale idle records, and
// tears down what was at a lost lease's index.
func (d *Daemon) restoreLeases(ctx context.Context, p *restorePlan, inv slot.Inventory, now time.Time) error {
	var missing []string
	var recs []leases.Record
	for _, l := range p.restored {
		fixed, err := d.mgr.RepairHost(l.slot)
		if err != nil {
			return fmt.Errorf("restore lease of slot %d: %w", l.rec.Index, err)
		}
		if inv[l.rec.Index]&slot.HasElement == 0 {
			missing = append(missing, l.slot.HostIf)
			fixed = append(fixed, "firewall element")
		}
		if len(fixed) > 0 {
			p.repaired[l.rec.Index] = fixed
		}
		if l.rec.TTL > 0 {
			l.rec.Expires = now.Add(l.rec.TTL)
			recs = append(recs, l.rec)
		}
	}
	if len(missing) > 0 {
		if err := d.mgr.Firewall().Add(ctx, missing...); err != nil {
			return fmt.Errorf("restore leases: %w", err)
		}
	}
	for _, l := range p.lost {
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
	// What sits at a lost lease's index is not the lease's slot: reclaim it
	// now, so that the index is clean for whoever gets it after the lease.
	lostObjects := slot.Inventory{}
	for _, l := range p.lost {
		if r, ok := p.dead[l.rec.Index]; ok && l.rec.Index <= d.cfg.Slots.Slots {
			lostObjects[l.rec.Index] = r
			delete(p.dead, l.rec.Index)
		}
	}
	if len(lostObjects) > 0 {
		res := d.mgr.Teardown(ctx, lostObjects, d.teardownOptions())
		if err := res.Err(); err != nil {
			return fmt.Errorf("clear the index of a lost lease: %w", err)
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
	for _, i := range slices.Sorted(maps.Keys(p.repaired)) {
		d.log.Info("restored lease: host side repaired, nothing inside touched", "slot", i, "repaired", strings.Join(p.repaired[i], ", "))
	}
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
