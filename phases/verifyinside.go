package phases

import (
	"context"
	"fmt"
	"strings"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/slot"
)

// insideToVerify returns the restored leases whose slot has something
// inside the namespace to verify: a guest device, an egress policy.
func (d *Daemon) insideToVerify() []*lease {
	if d.plan == nil {
		return nil
	}
	var out []*lease
	for _, l := range d.plan.restored {
		if l.slot != nil && (d.cfg.Slots.Guest.Enabled() || l.rec.Egress != nil) {
			out = append(out, l)
		}
	}
	return out
}

// verifyInside checks, after the daemon serves, what the restored leases
// have inside their namespaces, and puts back only what is missing: the
// guest device's parts (a tap that is there, a running VM's, is never
// made again), and the egress policy when the one in the namespace is not
// the recorded one (compared by fingerprint; a policy found intact is not
// written). A restart therefore changes nothing of a running VM's
// network.
func (d *Daemon) verifyInside(ctx context.Context, p *lifecycle.Progress, restored []*lease) error {
	p.SetTotal(int64(len(restored)), "restored leases")
	repairedN := 0
	for n, l := range restored {
		if err := ctx.Err(); err != nil {
			return nil
		}
		fixed, err := d.verifyLease(l)
		if err != nil {
			d.log.Error("restored lease: inside of its slot could not be verified", "slot", l.rec.Index, "error", err)
		} else if len(fixed) > 0 {
			repairedN++
			d.log.Warn("restored lease: inside of its slot repaired", "slot", l.rec.Index, "repaired", strings.Join(fixed, ", "))
		}
		p.SetDone(int64(n + 1))
	}
	d.log.Info("restored leases: inside of their slots verified", "verified", len(restored), "repaired", repairedN)
	return nil
}

// verifyLease verifies one restored lease's slot and returns what it
// repaired.
func (d *Daemon) verifyLease(restored *lease) ([]string, error) {
	// The lease as it is now, under the lock SetEgressPolicy holds: a
	// policy changed since the restore is the one to verify, and one being
	// changed is not written over. A lease ended meanwhile is not verified.
	svc := d.slots
	svc.egressMu.Lock()
	defer svc.egressMu.Unlock()
	svc.mu.Lock()
	cur := svc.leased[restored.rec.Index]
	var l lease
	if cur != nil {
		l = *cur
	}
	svc.mu.Unlock()
	if cur == nil || l.slot == nil || l.check != nil || l.rec.LeaseID != restored.rec.LeaseID {
		return nil, nil // ended, lost, or not verified (its slot unconfirmed)
	}
	fixed, err := d.mgr.RepairGuest(l.slot)
	if err != nil {
		return fixed, err
	}
	found, err := slot.InspectInside(l.slot)
	if err != nil {
		return fixed, err
	}
	pol, err := egressOf(l.rec.Egress)
	if err != nil {
		return fixed, fmt.Errorf("recorded egress policy: %w", err)
	}
	switch {
	case pol == nil && found.Fingerprint != "":
		if err := slot.ClearEgress(l.slot); err != nil {
			return fixed, err
		}
		fixed = append(fixed, "egress policy removed (the lease records none)")
	case pol != nil && found.Fingerprint != pol.Fingerprint(d.slots.egress):
		if err := slot.ApplyEgress(l.slot, *pol, d.slots.egress); err != nil {
			return fixed, err
		}
		what := "egress policy (missing)"
		if found.Fingerprint != "" {
			what = "egress policy (not the recorded one)"
		}
		fixed = append(fixed, what)
	}
	return fixed, nil
}

// repairAdopted gives the idle slots adopted from the last run the guest
// device they lack (that run had no --slot-guest-*, or something removed
// a part), before the pool can hand them out: there are at most a pool's
// worth, and nothing runs in them.
func (d *Daemon) repairAdopted() {
	if !d.cfg.Slots.Guest.Enabled() {
		return
	}
	for _, s := range d.plan.adopted {
		fixed, err := d.mgr.RepairGuest(s)
		switch {
		case err != nil:
			d.log.Error("adopted idle slot: guest device could not be made", "slot", s.Index, "error", err)
		case len(fixed) > 0:
			d.log.Info("adopted idle slot: guest device completed", "slot", s.Index, "repaired", strings.Join(fixed, ", "))
		}
	}
}
