package lease

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// A leased slot can be broken from outside while the daemon runs: its
// namespace file deleted (`ip netns del`) or unmounted, its host link
// deleted (`ip link del`, which deletes the pair), its firewall element
// removed. Every reconcile pass checks the leased slots against the scan
// it made (DESIGN.md §6, "Broken while leased"): in the listings the pass
// read anyway (the netns directory, mountinfo, /proc/net/dev, the set),
// a map lookup per lease, no system call of its own for an intact slot.
// A slot found broken is looked at again, alone, before anything is
// decided:
//
//	found                                 decision
//	namespace file gone, or unmounted     LOST: the daemon cannot reach the namespace
//	another namespace at the name         LOST
//	host link gone, namespace intact      repaired: the pair made again into it (slot.Manager.Relink)
//	firewall element gone                 repaired: put back
//
// A lost lease keeps its index and whatever is left of its slot: a
// workload still running in the namespace (a process keeps it alive after
// `ip netns del`) keeps its host link and its network until its owner
// releases the lease, which tears the remains down (pool.RetireLost).
// Each finding is a line of the audit log, a lease event counted, the
// lease's state and reason on Get and List, and the health warning
// slots-broken, which names the leases found broken while they are held.

// breakKind is what a reconcile pass found of a leased slot.
type breakKind int

const (
	intact      breakKind = iota
	nsGone                // the netns file is not there
	nsUnmounted           // the file is there, nothing mounted on it
	nsOther               // another namespace is bound there
	linkGone              // the host link is not there
	elementGone           // the firewall element is not there
)

// brokenBy says what the survey sr found of leased slot s.
func brokenBy(sr *slot.ScanResult, s *slot.Slot) breakKind {
	have := sr.Inventory[s.Index]
	id, bound := sr.Bound[s.Index]
	switch {
	case have&slot.HasNetns == 0:
		return nsGone
	case !bound:
		return nsUnmounted
	case id != s.NetnsID:
		return nsOther
	case have&slot.HasHostLink == 0:
		return linkGone
	case have&slot.HasElement == 0:
		return elementGone
	}
	return intact
}

// lostReason is what Get says of a lease lost to a break of kind k.
func lostReason(k breakKind, s *slot.Slot) string {
	const after = ": the daemon no longer reaches the lease's namespace; a workload in it keeps what it has until the lease is released"
	switch k {
	case nsGone:
		return fmt.Sprintf("lost while leased: its namespace file %s was deleted from outside the daemon%s", s.NetnsPath, after)
	case nsUnmounted:
		return fmt.Sprintf("lost while leased: its namespace was unmounted from %s from outside the daemon%s", s.NetnsPath, after)
	default:
		return fmt.Sprintf("lost while leased: the namespace at %s is not the leased one (made again from outside the daemon)%s", s.NetnsPath, after)
	}
}

// suspect is a lease a pass found broken, as the table held it then.
type suspect struct {
	l    *Lease
	sl   *slot.Slot
	Rec  leases.Record
	kind breakKind
}

// CheckLeased settles every lease that a reconcile pass's survey sr, made
// after since, found broken: lost, or repaired. Leases not verified yet
// (a restart's), lost already, attached (a CNI runtime's namespace holds
// their inside end) or taken after since are left alone.
func (s *Service) CheckLeased(ctx context.Context, sr *slot.ScanResult, since time.Time) {
	unreadable := map[int]bool{}
	for _, u := range sr.Unreadable {
		unreadable[u.Index] = true
	}
	// The leases to look at are copied under the table's lock, and
	// looked up in the survey after: Acquires wait for the copy only.
	type leased struct {
		l  *Lease
		sl *slot.Slot
	}
	s.table.mu.Lock()
	held := make([]leased, 0, len(s.table.leased))
	for i, l := range s.table.leased {
		if l.Slot != nil && l.check == nil && l.Rec.Attachment == nil && !unreadable[i] && l.Rec.Acquired.Before(since) {
			held = append(held, leased{l, l.Slot})
		}
	}
	s.table.mu.Unlock()
	var found []suspect
	whole := make(map[int]*slot.Slot, len(held))
	for _, h := range held {
		// A slot's kernel identity never changes while it is leased but
		// here (relink, under its policy lock): read without the table's.
		if k := brokenBy(sr, h.sl); k != intact {
			found = append(found, suspect{l: h.l, sl: h.sl, Rec: s.table.copyOf(h.l).Rec, kind: k})
		} else {
			whole[h.sl.Index] = h.sl
		}
	}
	s.seenInPass(sr.Links, whole)
	slices.SortFunc(found, func(a, b suspect) int { return a.Rec.Index - b.Rec.Index })
	for _, f := range found {
		if ctx.Err() != nil {
			return
		}
		s.settleBroken(ctx, f)
	}
	s.breaks.publish(s.table)
}

// settleBroken decides on one lease the pass found broken, under its
// slot's policy lock (a Release waits for it, and finds the lease lost or
// repaired), after a look at the kernel of its own: a listing is a
// snapshot.
func (s *Service) settleBroken(ctx context.Context, f suspect) {
	i := f.Rec.Index
	defer s.lockPolicy(i)()
	s.table.mu.Lock()
	held := s.table.leased[i] == f.l && f.l.Slot == f.sl
	s.table.mu.Unlock()
	if !held {
		return // ended meanwhile
	}
	kind := f.kind
	switch id, err := netns.Stat(f.sl.NetnsPath); {
	case err == nil && id == f.sl.NetnsID:
		if kind < linkGone {
			return // the listing was stale: the namespace is there
		}
	case err == nil:
		kind = nsOther
	case errors.Is(err, netns.ErrNotNamespace):
		kind = nsUnmounted
	default:
		kind = nsGone
	}
	switch kind {
	case linkGone:
		s.relink(ctx, f)
	case elementGone:
		if err := s.mgr.Firewall().Add(ctx, f.sl.HostIf); err != nil {
			s.log.Warn("lease: the slot's firewall element, removed from outside, could not be put back; tried again at the next pass", "slot", i, "error", err)
			return
		}
		s.repaired(f, "firewall element (removed from outside) put back")
	default:
		s.lose(f, lostReason(kind, f.sl))
	}
}

// relink makes the pair of a slot whose host link was deleted from
// outside again into its intact namespace, and records the new host
// link, so that a restart finds the slot as recorded. A slot that cannot
// be relinked is lost.
func (s *Service) relink(ctx context.Context, f suspect) {
	i := f.Rec.Index
	s.table.mu.Lock()
	old, last := f.sl.HostIfIndex, f.l.seen
	s.table.mu.Unlock()
	idx, err := s.mgr.Relink(ctx, f.sl)
	switch {
	case errors.Is(err, slot.ErrHostLinkThere):
		return // back meanwhile: the next pass looks again
	case errors.Is(err, slot.ErrGone):
		s.lose(f, lostReason(nsOther, f.sl))
		return
	case err != nil:
		s.lose(f, fmt.Sprintf("lost while leased: its host link %s was deleted from outside the daemon and could not be made again (%v); a workload in its namespace keeps running, without its network, until the lease is released", f.sl.HostIf, err))
		return
	}
	rec, err := s.records.update(ctx, i, func(r *leases.Record) error {
		if r.State != leases.Leased || !sameLease(r.LeaseID, f.Rec.LeaseID) {
			return leases.ErrNotFound
		}
		r.HostIfindex = idx
		if last.ifindex == old {
			// What the deleted link counted, as last seen.
			r.Ledger = r.Ledger.Relinked(last.counts)
		}
		return nil
	})
	s.table.mu.Lock()
	f.sl.HostIfIndex = idx
	f.l.seen = linkSeen{ifindex: idx} // the new link counts from 0
	if err == nil {
		f.l.Rec = rec
	}
	s.table.mu.Unlock()
	if err != nil {
		s.log.Warn("lease: the slot's new host link could not be recorded: a restart before the next change of the lease takes it for lost", "slot", i, "error", err)
	}
	s.portsRelinked(ctx, i, f.sl.HostIf, f.Rec.Ports)
	if bw := f.Rec.Bandwidth; bw != nil {
		// The qdiscs went with the old link; the ifb stayed.
		if err := s.applyBandwidth(ctx, f.sl, bw); err != nil {
			s.log.Warn("lease: the bandwidth limits could not be set on the slot's new host link; verify-inside tries again", "slot", i, "error", err)
		}
	}
	s.repaired(f, fmt.Sprintf("host link %s (deleted from outside) made again into its namespace", f.sl.HostIf))
}

// lose makes lease f lost: its slot out of the pool's hands (its index
// stays the lease's), its remains left for the lease's end.
func (s *Service) lose(f suspect, reason string) {
	if err := s.pool.Lose(f.sl); err != nil {
		s.log.Warn("lost lease's slot was not the pool's", "slot", f.Rec.Index, "error", err)
		return
	}
	s.table.mu.Lock()
	f.l.Slot, f.l.LostReason, f.l.remains = nil, reason, true
	s.table.mu.Unlock()
	s.count("lost")
	s.breaks.note(f.Rec, "lost")
	s.audit.Warn("lease lost: its slot was broken from outside the daemon", leaseAttrs(f.Rec, "reason", reason)...)
}

// repaired reports what was put back of lease f's slot.
func (s *Service) repaired(f suspect, what string) {
	s.table.mu.Lock()
	f.l.Repaired = append(f.l.Repaired, what+" at "+time.Now().UTC().Format(time.RFC3339))
	s.table.mu.Unlock()
	s.count("repaired")
	s.breaks.note(f.Rec, "repaired")
	s.audit.Warn("lease: its slot was broken from outside the daemon and repaired", leaseAttrs(f.Rec, "repaired", what)...)
}

// leaseAttrs names lease rec in a log line, before more.
func leaseAttrs(rec leases.Record, more ...any) []any {
	return append([]any{"slot", rec.Index, "owner", names.Shown(rec.Owner), "request_id", names.Shown(rec.RequestID), "principal", rec.Principal}, more...)
}

// breaks is what the checks found broken from outside among the leases
// held, for the slots-broken warning: kept while the lease is held.
type breaks struct {
	health Warnings // nil: no warning (a service without a daemon)

	mu    sync.Mutex
	found map[int]breakNote // by slot index
}

// breakNote is one lease found broken: which lease, and what became of it.
type breakNote struct {
	leaseID string
	what    string // "lost" or "repaired"
}

// note notes lease rec as what ("lost", "repaired").
func (b *breaks) note(rec leases.Record, what string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.found == nil {
		b.found = map[int]breakNote{}
	}
	b.found[rec.Index] = breakNote{leaseID: rec.LeaseID, what: what}
}

// publish sets the slots-broken warning to the leases noted that table
// still holds, or clears it.
func (b *breaks) publish(table *Table) {
	if b.health == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	byWhat := map[string][]int{}
	for i, n := range b.found {
		if l := table.copyAt(i); l == nil || l.Rec.LeaseID != n.leaseID {
			delete(b.found, i) // ended: nothing left to say
			continue
		}
		byWhat[n.what] = append(byWhat[n.what], i)
	}
	if len(b.found) == 0 {
		b.health.ClearWarning(WarnSlotsBroken)
		return
	}
	var parts []string
	for _, what := range slices.Sorted(maps.Keys(byWhat)) {
		slots := byWhat[what]
		slices.Sort(slots)
		parts = append(parts, fmt.Sprintf("%s %v", what, slots))
	}
	b.health.Warn(WarnSlotsBroken, fmt.Sprintf("%d leased slots were broken from outside the daemon (%s): owners see each in Get; a lost lease keeps its index until it is released",
		len(b.found), strings.Join(parts, ", ")))
}
