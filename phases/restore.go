package phases

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// restorePlan is what the reclaim phase decided for every slot it found on
// the host or in the records (DESIGN.md, section 6):
//
//	found                     record                       decision
//	anything                  leased                       restored, VERIFYING: checked after SERVING (restoreCheck)
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

// lostIndices returns the indices of the leases found lost, sorted.
func (p *restorePlan) lostIndices() []int {
	out := make([]int, len(p.lost))
	for i, l := range p.lost {
		out[i] = l.rec.Index
	}
	return out
}

// classifier is what the restore's classification reads besides the
// records and the scan: the configuration, the host's slots through mgr,
// and whether the records were lost (safe mode). A start and
// `phasegate reclaim` classify alike.
type classifier struct {
	cfg      Config
	mgr      *slot.Manager
	safeMode bool
}

// classify matches the records with what is on the host. It reads the host
// and the records and changes nothing. A leased record costs no system
// call here: its slot is checked after SERVING (restoreCheck); an idle
// one is checked now (there are as many as the pool holds).
func (c classifier) classify(ctx context.Context, recs []leases.Record, bad []int, inv slot.Inventory) (*restorePlan, error) {
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
		if !c.cfg.withinSlots(rec.Index) {
			// Recorded by a run with more slots: a lease there cannot be
			// served by this configuration, but must not be destroyed.
			if rec.State == leases.Leased {
				p.lost = append(p.lost, &lease{rec: rec, lostReason: fmt.Sprintf("slot %d is beyond --slots %d", rec.Index, c.cfg.Slots.Slots)})
			} else {
				p.stale = append(p.stale, rec.Index)
				if r, ok := inv[rec.Index]; ok {
					p.dead[rec.Index] = r
				}
			}
			continue
		}
		if rec.State == leases.Leased {
			p.restored = append(p.restored, &lease{rec: rec, slot: recordedSlot(c.cfg.Slots, rec), check: newLeaseCheck()})
			if r, ok := inv[rec.Index]; ok {
				p.found[rec.Index] = r
			}
			continue
		}
		sl, err := c.mgr.Identify(rec.Index, rec.Netns, rec.HostIfindex)
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
	if c.safeMode && len(p.dead) > 0 {
		// The records are lost: a slot something lives in may be a
		// workload's. Quarantine it rather than cut it off.
		held, err := inhabited(p.dead, c.cfg.Slots)
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
func (c classifier) identifyRestored(p *restorePlan) error {
	var intact []*lease
	for _, l := range p.restored {
		_, err := c.mgr.Identify(l.rec.Index, l.rec.Netns, l.rec.HostIfindex)
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
// leaves the next start the same work. A state filesystem that takes no
// write (full, read-only) does not stop the start: the fresh TTLs hold in
// memory, the stale records stay for the next start, and the daemon
// serves degraded, the state-dir warning saying why.
func (d *Daemon) renewLeases(ctx context.Context, p *restorePlan, now time.Time) error {
	var recs []leases.Record
	for _, l := range slices.Concat(p.restored, p.lost) {
		if l.rec.TTL > 0 {
			l.rec.Expires = now.Add(l.rec.TTL)
			recs = append(recs, l.rec)
		}
	}
	if len(recs) > 0 {
		if err := d.records.put(ctx, recs...); stateFault(err) {
			d.log.Error("restored leases' fresh TTLs cannot be recorded: they hold in memory; serving degraded", "leases", len(recs), "error", err)
		} else if err != nil {
			return fmt.Errorf("renew restored leases: %w", err)
		}
	}
	if len(p.stale) > 0 {
		if err := d.records.remove(ctx, p.stale...); stateFault(err) {
			d.log.Error("records of slots gone cannot be deleted: the next start finds them again", "slots", len(p.stale), "error", err)
		} else if err != nil {
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
		d.log.Warn("lease lost across the restart", "slot", l.rec.Index, "owner", names.Shown(l.rec.Owner), "reason", l.lostReason)
	}
	if len(p.held) > 0 {
		d.log.Warn("safe mode: slots with processes inside are kept, quarantined, and reported: they may be leased",
			"slots", fmt.Sprint(p.held))
	}
	if len(p.bad) > 0 {
		d.log.Error("unreadable records: their slots are quarantined", "slots", fmt.Sprint(p.bad))
	}
}
