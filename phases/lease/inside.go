package lease

import (
	"context"
	"strings"
	"time"

	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/shape"
	"github.com/phasegate/phasegate/network/slot"
)

// insidePass is how long one pass of the verify-inside task takes over
// every lease whose slot has something inside to check: the checks of a
// pass are spread over it, so that 10,000 leases cost a few percent of one
// core, not a burst. A change the slot's root makes inside is put back
// within a pass; what holds the slot to its policy meanwhile is the host's
// chain, which the root cannot reach (package nft). Get checks and repairs
// one slot at once.
const insidePass = 5 * time.Minute

// hasInside reports whether lease l's slot has something the daemon wrote
// inside it or for it: a guest device, an egress policy, bandwidth limits.
func (s *Service) hasInside(l *Lease) bool {
	return l.Slot != nil && (s.cfg.Guest.Enabled() || l.Rec.Egress != nil || l.Rec.Bandwidth != nil)
}

// insideToVerify returns copies of the leases to verify, taken under the
// table's lock: of those given (the restored leases), the ones whose
// slots have something the daemon wrote for them (hasInside), which the
// pass after a restart checks one after the other; with nil, every lease
// held now with a slot, whose settings (slot.Manager.RepairSettings) a
// periodic pass checks too, spread over it.
func (s *Service) insideToVerify(of []*Lease) []Lease {
	s.table.mu.Lock()
	defer s.table.mu.Unlock()
	keep := s.hasInside
	if of == nil {
		keep = func(l *Lease) bool { return l.Slot != nil }
		for _, l := range s.table.leased {
			of = append(of, l)
		}
	}
	var out []Lease
	for _, l := range of {
		if keep(l) {
			out = append(out, *l)
		}
	}
	return out
}

// VerifyInside is the verify-inside task. After the daemon serves and the
// restored leases are settled, it checks what those leases' slots hold and
// puts back only what is missing or changed (repairLease): a restart
// therefore changes nothing of a running VM's network. Then, every
// insidePass, it checks every lease's slot again, so that what a slot's
// root changes inside (its egress table flushed, the guest NAT removed) is
// seen, counted and repaired.
func (svc *Service) VerifyInside(ctx context.Context, p *lifecycle.Progress, restored []*Lease) error {
	if restored := svc.insideToVerify(restored); len(restored) > 0 {
		svc.verifyPass(ctx, p, restored, 0, "restored lease")
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(insidePass / 10):
		}
		svc.verifyPass(ctx, p, svc.insideToVerify(nil), insidePass, "lease")
	}
}

// verifyPass checks the slots of leases, spreading the checks over span
// (0: one after the other), and logs what it repaired; what names the
// leases in the log ("restored lease").
func (s *Service) verifyPass(ctx context.Context, p *lifecycle.Progress, leases []Lease, span time.Duration, what string) {
	p.SetTotal(int64(len(leases)), what+"s")
	p.SetDone(0)
	repairedN := 0
	var gap time.Duration
	if len(leases) > 0 {
		gap = span / time.Duration(len(leases))
	}
	for n, l := range leases {
		if n > 0 && gap > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(gap):
			}
		}
		if ctx.Err() != nil {
			return
		}
		fixed, err := s.repairLease(ctx, l.Rec.Index, l.Rec.LeaseID)
		switch {
		case err != nil:
			s.log.Error(what+": inside of its slot could not be verified", "slot", l.Rec.Index, "error", err)
		case len(fixed) > 0:
			repairedN++
			s.log.Warn(what+": inside of its slot repaired", "slot", l.Rec.Index, "owner", names.Shown(l.Rec.Owner), "repaired", strings.Join(fixed, ", "))
		}
		p.SetDone(int64(n + 1))
	}
	if span == 0 || repairedN > 0 {
		s.log.Info(what+"s: inside of their slots verified", "verified", len(leases), "repaired", repairedN)
	}
}

// repairLease verifies what slot i of lease leaseID holds against what the
// daemon wrote for the lease — the settings of the slot's own links and
// no IPv6 inside (slot.Manager.RepairSettings: a slot is the same sandbox
// whatever its root or the host set), its bandwidth limits on the host
// link (shape.Repair: compared with the record), the guest device's parts (a tap that is
// there, perhaps attached to a running VM, is never made again), the egress
// policy on the host and inside (compared by fingerprint; an intact policy
// is not written) — puts back what is missing or changed, and returns what
// it repaired (counted as the lease event drift_repaired). It takes the slot's policy lock
// and looks at the lease as it is then: a lease ended, lost or not verified
// yet is left alone.
func (s *Service) repairLease(ctx context.Context, i int, leaseID string) ([]string, error) {
	defer s.lockPolicy(i)()
	s.table.mu.Lock()
	l := s.table.leased[i]
	ok := l != nil && l.Slot != nil && l.check == nil && l.Rec.LeaseID == leaseID
	var sl *slot.Slot
	var pol *egress.Policy
	var bw *shape.Limits
	inside := false
	if ok {
		sl, pol, bw, inside = l.Slot, l.Rec.Egress, l.Rec.Bandwidth, s.hasInside(l)
	}
	s.table.mu.Unlock()
	if !ok {
		return nil, nil
	}
	fixed, err := s.mgr.RepairSettings(sl)
	if err == nil && bw != nil {
		var shaped []string
		shaped, err = s.repairBandwidth(ctx, sl, bw)
		fixed = append(fixed, shaped...)
	}
	if err != nil || !inside {
		if len(fixed) > 0 {
			s.count("drift_repaired")
		}
		return fixed, err
	}
	guest, err := s.mgr.RepairGuest(sl)
	fixed = append(fixed, guest...)
	if err != nil {
		return fixed, err
	}
	st, err := s.mgr.InspectEgress(ctx, sl)
	if err != nil {
		return fixed, err
	}
	want := ""
	if pol != nil {
		want = pol.Fingerprint(s.egress)
	}
	if st.Host != want || st.Inside != want {
		if err := s.applyEgress(ctx, sl, pol); err != nil {
			return fixed, err
		}
		fixed = append(fixed, DescribeDrift(st, want)...)
	}
	if len(fixed) > 0 {
		s.count("drift_repaired")
	}
	return fixed, nil
}

// DescribeDrift names the sides of an egress policy found other than want.
func DescribeDrift(st slot.EgressState, want string) []string {
	var out []string
	for _, side := range []struct{ name, got string }{{"host", st.Host}, {"inside", st.Inside}} {
		switch {
		case side.got == want:
		case want == "":
			out = append(out, "egress policy "+side.name+" (the lease records none)")
		case side.got == "":
			out = append(out, "egress policy "+side.name+" (missing)")
		default:
			out = append(out, "egress policy "+side.name+" (not the recorded one)")
		}
	}
	return out
}
