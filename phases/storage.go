package phases

import (
	"context"
	"fmt"
	"slices"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/index"
)

// runStorage builds the allocator from what the restore decided: the
// indices of restored leases, lost leases and adopted slots are taken,
// those of dead slots still to reclaim (in the background) and of slots
// kept in safe mode are quarantined, so that no index is ever handed out
// while something of another slot is still there. The pool, made from it
// next, owns it from then on: every later index change goes through the
// pool.
func (d *Daemon) runStorage(ctx context.Context, p *lifecycle.Progress) error {
	n := d.cfg.Slots.Slots
	var quarantine []int
	if d.report != nil {
		quarantine = d.report.Quarantine()
	}
	if !d.cfg.reclaimInForeground() {
		for i := range d.plan.dead {
			quarantine = append(quarantine, i)
		}
	}
	quarantine = append(append(quarantine, d.plan.heldIndices()...), d.plan.bad...)
	for _, u := range d.unreadable {
		quarantine = append(quarantine, u.Index)
	}
	quarantine = slices.DeleteFunc(quarantine, func(i int) bool { return !d.cfg.withinSlots(i) })
	idx, err := index.New(n, quarantine)
	if err != nil {
		return lifecycle.Permanent(err)
	}
	for _, l := range append(slices.Clone(d.plan.restored), d.plan.lost...) {
		if d.cfg.withinSlots(l.Rec.Index) {
			if err := idx.Claim(l.Rec.Index); err != nil {
				return lifecycle.Permanent(fmt.Errorf("lease of slot %d: %w", l.Rec.Index, err))
			}
		}
	}
	for _, s := range d.plan.adopted {
		if err := idx.Claim(s.Index); err != nil {
			return lifecycle.Permanent(fmt.Errorf("idle slot %d: %w", s.Index, err))
		}
	}
	d.idx = idx
	if q := idx.Quarantined(); len(q) > 0 {
		p.SetMessage(fmt.Sprintf("%d slots quarantined until reclaimed", len(q)))
	}
	return nil
}
