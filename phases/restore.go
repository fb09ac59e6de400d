package phases

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/lease"
)

// restorePlan is what the reclaim phase decided for every slot it found on
// the host or in the records (DESIGN.md section 6):
//
//	found                     record                       decision
//	anything                  leased                       restored, VERIFYING: checked after SERVING (restoreCheck)
//	intact, identity matches  idle                         adopted into the warm pool (held or reclaimed when the records may miss leases)
//	anything                  none, identity differs       dead: reclaimed
//	anything                  leased beyond --slots        lost: reported; the record stays
//	the namespace recorded    held                         held, start after start, until an operator acts
//	something lives in it     none, and the records        held: quarantined, recorded held, reported; never destroyed
//	                          cannot vouch for it
//
// The records cannot vouch for a slot without a lease record when they may
// miss leases (a file set aside, a journal lost: safe mode), or when the
// firewall table's stamp set of another generation of records than these
// names the slot (it was made under records that are gone). A slot stamped by nobody was
// made by something that kept no records: a leak, reclaimed (DESIGN.md
// section 6, "When the records cannot vouch").
//
// A restored lease's slot is what its record says until it is verified:
// then it is restored (same owner; only the host side repaired, its host
// link made again if it was deleted) or lost (reported; the index stays
// the lease's, what was at it torn down unless something lives in it,
// which is held).
type restorePlan struct {
	restored []*lease.Lease   // leases to verify, with a fresh full TTL
	found    slot.Inventory   // what the scan found at the restored leases' indices
	lost     []*lease.Lease   // leases this configuration cannot serve
	adopted  []*slot.Slot     // idle slots, for the warm pool
	dead     slot.Inventory   // what is on the host and belongs to nobody
	held     []lease.HeldSlot // slots something lives in that no record vouches for
	bad      []int            // indices whose record cannot be read
	stale    []int            // idle or held records whose slot is gone: deleted
	// uncertain are the dead whose records the store may have lost (safe
	// mode, or another generation's stamp) and in which nothing lives:
	// reclaimed, and named, since a lease may have been theirs. heldNow
	// are the indices this start held (the others of held were already).
	uncertain, heldNow []int
}

// String is the start log's summary.
func (p *restorePlan) String() string {
	s := fmt.Sprintf("restored %d leases (verified after serving), adopted %d idle slots, reclaimed %d, lost %d",
		len(p.restored), len(p.adopted), len(p.dead), len(p.lost))
	if len(p.held) > 0 {
		s += fmt.Sprintf(", held %d", len(p.held))
	}
	return s
}

// heldIndices returns the indices of the held slots, sorted.
func (p *restorePlan) heldIndices() []int {
	out := make([]int, len(p.held))
	for i, h := range p.held {
		out[i] = h.Index
	}
	return out
}

// unrecordedHeld returns the Held records of the held slots that no
// record says are held yet.
func (p *restorePlan) unrecordedHeld() []leases.Record {
	var out []leases.Record
	for _, h := range p.held {
		if !h.Recorded {
			out = append(out, h.Record())
		}
	}
	return out
}

// lostIndices returns the indices of the leases found lost, sorted.
func (p *restorePlan) lostIndices() []int {
	out := make([]int, len(p.lost))
	for i, l := range p.lost {
		out[i] = l.Rec.Index
	}
	return out
}

// classifier is what the restore's classification reads besides the
// records and the scan: the configuration, the host's slots through mgr,
// and what the records can vouch for. A start and `phasegate reclaim`
// classify alike.
type classifier struct {
	cfg Config
	mgr *slot.Manager
	// safeMode: the records may miss leases (a file set aside, a journal
	// lost); lost says why.
	safeMode bool
	lost     string
	// generation is the records' own: a slot the table's stamp sets say
	// was made under another was made under records that are gone.
	// unvouched: the records are new (leases.Opened.Unvouched), so the
	// stamp sets of others are read; records that are not were checked
	// against them by the start that made them.
	generation string
	unvouched  bool
	// hints are what a lost journal still told of the slots, by index.
	hints map[int]leases.LostChange
	now   time.Time
}

// vouchless reports whether the records cannot vouch for slot i, which
// has no lease record, by the stamps of the slots made under other
// records (slot.Manager.Stamps): something living in it may be a
// tenant's.
func (c classifier) vouchless(i int, stamps map[int]string) bool {
	st := stamps[i]
	return c.safeMode || (st != "" && st != c.generation)
}

// heldReason says why slot i is held.
func (c classifier) heldReason(i int, stamps map[int]string) string {
	if c.safeMode {
		return c.lost + "; something lives in it"
	}
	return fmt.Sprintf("made under records that are gone (store %s), and something lives in it", stamps[i])
}

// classify matches the records with what is on the host. It reads the host
// and the records and changes nothing. A leased record costs no system
// call here: its slot is checked after SERVING (restoreCheck); an idle
// or held one is checked now (there are as many as the pool holds, and as
// an operator left held). The processes are scanned only when a slot the
// records cannot vouch for is found.
func (c classifier) classify(ctx context.Context, recs []leases.Record, bad []int, inv slot.Inventory) (*restorePlan, error) {
	p := &restorePlan{dead: slot.Inventory{}, found: slot.Inventory{}, bad: bad}
	recorded := map[int]bool{}
	for _, i := range bad {
		recorded[i] = true // neither reclaimed nor handed out: quarantined
	}
	var unsure []*slot.Slot // idle slots safe mode may not adopt as they are
	for _, rec := range recs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if rec.State == leases.Held {
			// Kept while the namespace held is the one at its file; gone
			// or made again, what is there now is judged as unrecorded.
			if id, err := netns.Stat(c.cfg.Slots.NetnsPath(rec.Index)); err == nil && id == rec.Netns {
				recorded[rec.Index] = true
				p.held = append(p.held, lease.HeldFrom(rec))
			} else {
				p.stale = append(p.stale, rec.Index)
			}
			continue
		}
		recorded[rec.Index] = true
		if !c.cfg.withinSlots(rec.Index) {
			// Recorded by a run with more slots: a lease there cannot be
			// served by this configuration, but must not be destroyed.
			if rec.State == leases.Leased {
				p.lost = append(p.lost, &lease.Lease{Rec: rec, LostReason: fmt.Sprintf("slot %d is beyond --slots %d", rec.Index, c.cfg.Slots.Slots)})
			} else {
				p.stale = append(p.stale, rec.Index)
				if r, ok := inv[rec.Index]; ok {
					p.dead[rec.Index] = r
				}
			}
			continue
		}
		if rec.State == leases.Leased {
			p.restored = append(p.restored, lease.Restored(rec, recordedSlot(c.cfg.Slots, rec)))
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
		case err == nil && c.safeMode:
			unsure = append(unsure, sl)
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
	if err := c.holdInhabited(ctx, p, unsure, inv); err != nil {
		return nil, err
	}
	slices.SortFunc(p.restored, func(a, b *lease.Lease) int { return a.Rec.Index - b.Rec.Index })
	slices.SortFunc(p.lost, func(a, b *lease.Lease) int { return a.Rec.Index - b.Rec.Index })
	slices.SortFunc(p.adopted, func(a, b *slot.Slot) int { return a.Index - b.Index })
	slices.SortFunc(p.held, func(a, b lease.HeldSlot) int { return a.Index - b.Index })
	slices.Sort(p.uncertain)
	return p, nil
}

// holdInhabited holds the dead slots the records cannot vouch for, and
// the idle ones safe mode may not adopt (unsure), in which something
// lives; the others are reclaimed, those that may have been leased named
// (uncertain). The stamps are read only when the records are new, there
// are dead slots and the records are not known short already (a list of
// the table's sets, and a dump of any other store's), the processes
// scanned only when there is such a slot.
func (c classifier) holdInhabited(ctx context.Context, p *restorePlan, unsure []*slot.Slot, inv slot.Inventory) error {
	var stamps map[int]string
	if c.unvouched && !c.safeMode && len(p.dead) > 0 {
		var err error
		if stamps, err = c.mgr.Stamps(ctx); err != nil {
			return fmt.Errorf("the stamps of the slots no record names: %w", err)
		}
	}
	var check []int
	for i, r := range p.dead {
		if c.vouchless(i, stamps) && r&slot.HasNetns != 0 {
			check = append(check, i)
		}
	}
	for _, sl := range unsure {
		check = append(check, sl.Index)
		// Its idle record goes, whatever follows: held, or reclaimed.
		p.stale = append(p.stale, sl.Index)
		p.dead[sl.Index] = inv[sl.Index]
	}
	if len(check) == 0 {
		return nil
	}
	live, err := netns.ScanLiveness()
	if err != nil {
		return fmt.Errorf("records that cannot vouch for every slot: %w", err)
	}
	for _, i := range check {
		id, err := netns.Stat(c.cfg.Slots.NetnsPath(i))
		if err != nil || !live.LivesIn(id) {
			p.uncertain = append(p.uncertain, i)
			continue
		}
		h := lease.HeldSlot{Index: i, Netns: id, Reason: c.heldReason(i, stamps), Since: c.now, Stamp: stamps[i]}
		if n, ok := c.hints[i]; ok {
			h.Owner, h.RequestID = n.Owner, n.RequestID
		}
		p.held = append(p.held, h)
		p.heldNow = append(p.heldNow, i)
		delete(p.dead, i)
	}
	slices.Sort(p.heldNow)
	return nil
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
	var intact []*lease.Lease
	for _, l := range p.restored {
		_, err := c.mgr.Identify(l.Rec.Index, l.Rec.Netns, l.Rec.HostIfindex)
		switch {
		case err == nil:
			intact = append(intact, l)
		case errors.Is(err, slot.ErrGone):
			p.lost = append(p.lost, &lease.Lease{Rec: l.Rec, LostReason: err.Error()})
			if r, ok := p.found[l.Rec.Index]; ok {
				p.dead[l.Rec.Index] = r // what is there now is not the lease's
			}
		default:
			return err
		}
	}
	p.restored = intact
	slices.SortFunc(p.lost, func(a, b *lease.Lease) int { return a.Rec.Index - b.Rec.Index })
	return nil
}

// renewLeases gives every lease a fresh full TTL (what etcd does after a
// leader change: owners get a whole TTL to reconnect) and records that,
// deletes stale idle and held records, and records the slots newly held,
// in one transaction each: the records
// stay the truth, so a crash at any point of the verification that follows
// leaves the next start the same work. A state filesystem that takes no
// write (full, read-only) does not stop the start: the fresh TTLs hold in
// memory, the stale records stay for the next start, and the daemon
// serves degraded, the state-dir warning saying why.
func (d *Daemon) renewLeases(ctx context.Context, p *restorePlan, now time.Time) error {
	var recs []leases.Record
	for _, l := range slices.Concat(p.restored, p.lost) {
		if l.Rec.TTL > 0 {
			l.Rec.Expires = now.Add(l.Rec.TTL)
			recs = append(recs, l.Rec)
		}
	}
	if len(recs) > 0 {
		if err := d.records.Put(ctx, recs...); stateFault(err) {
			d.log.Error("restored leases' fresh TTLs cannot be recorded: they hold in memory; serving degraded", "leases", len(recs), "error", err)
		} else if err != nil {
			return fmt.Errorf("renew restored leases: %w", err)
		}
	}
	if len(p.stale) > 0 {
		if err := d.records.Remove(ctx, p.stale...); stateFault(err) {
			d.log.Error("records of slots gone cannot be deleted: the next start finds them again", "slots", len(p.stale), "error", err)
		} else if err != nil {
			return fmt.Errorf("delete the records of slots gone: %w", err)
		}
	}
	held := p.unrecordedHeld()
	if len(held) > 0 {
		if err := d.records.Put(ctx, held...); err != nil {
			return fmt.Errorf("record the held slots: %w", err)
		}
		for k := range p.held {
			p.held[k].Recorded = true
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
		d.log.Warn("lease lost across the restart", "slot", l.Rec.Index, "owner", names.Shown(l.Rec.Owner), "reason", l.LostReason)
	}
	for _, h := range p.held {
		d.log.Warn("slot held: something lives in it and no record vouches for it; kept, quarantined, until `phasegate held` adopts or releases it",
			"slot", h.Index, "netns_inode", h.Netns.Ino, "reason", h.Reason, "owner", names.Shown(h.Owner), "request_id", names.Shown(h.RequestID))
	}
	if len(p.uncertain) > 0 {
		d.log.Warn("slots the records cannot vouch for, with nothing inside, reclaimed: a lease they carried is lost",
			"slots", fmt.Sprint(p.uncertain))
	}
	if len(p.bad) > 0 {
		d.log.Error("unreadable records: their slots are quarantined", "slots", fmt.Sprint(p.bad))
	}
}
