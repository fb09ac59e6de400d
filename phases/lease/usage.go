package lease

import (
	"context"
	"errors"

	"github.com/phasegate/phasegate/network/account"
	"github.com/phasegate/phasegate/network/slot"
)

// A lease's usage (issue 46, accounting): the bytes and packets its
// slot's host link carried each way, from the kernel's own counters of
// the link (package network/account), plus what its earlier links and
// policies counted (its record's ledger), and the packets its egress
// policies dropped on the host. The link's counters live with the link,
// across restarts; they go back only when the link is made again (relink,
// broken.go), which carries the old link's counters as last seen into
// the ledger: the reconciler's every pass, a Get and a List see them.

// startLedger is the ledger of a lease that begins on slot sl now: where
// its link's counters stand, so that what a warm slot's link counted of
// its own before is not the lease's.
func (s *Service) startLedger(sl *slot.Slot) account.Ledger {
	c, err := account.OfLink(sl.HostIfIndex)
	if err != nil {
		s.log.Warn("lease: its link's counters are unreadable; its usage counts from the link's making", "slot", sl.Index, "error", err)
		return account.Ledger{}
	}
	return account.Ledger{Start: c}
}

// usageNow reads lease l's usage (a copy): its link's counters and its
// policy's drops on the host, read now (Get, and a lease's end), and the
// link's counters as read.
func (s *Service) usageNow(ctx context.Context, l *Lease) (account.Usage, linkSeen, error) {
	if l.Slot == nil {
		return l.Rec.Ledger.Carried, linkSeen{}, nil // lost: its link is gone
	}
	ifindex := s.table.hostIfIndex(l.Slot)
	c, err := account.OfLink(ifindex)
	if errors.Is(err, account.ErrNoLink) && l.seen.ifindex == ifindex {
		// Gone with the namespace of an attachment's container, which
		// ended: what it counted, as last seen.
		c, err = l.seen.counts, nil
	}
	if err != nil {
		return account.Usage{}, linkSeen{}, err
	}
	return l.Rec.Ledger.Usage(c, s.hostDrops(ctx, l.Rec.Index, l.Slot, l.Rec.Egress)), linkSeen{ifindex, c}, nil
}

// Traffic is what the links of the leased slots carried while this
// process watched them: the sum of what each read of a lease's link
// counters added to the one before (a lease restored at a start counts
// from the first read), never going back. It is /metrics' total.
func (s *Service) Traffic() account.Counts {
	s.table.mu.Lock()
	defer s.table.mu.Unlock()
	return s.table.traffic
}

// usageListed fills the usage of every leased slot of out from one read
// of the host's links (List): bytes and packets, and the drops of the
// lease's earlier policies only, since reading each slot's drop counter
// would cost a call per slot.
func (s *Service) usageListed(out []Slot) {
	links, err := account.ReadNetDev()
	if err != nil {
		s.log.Warn("list: the slots' link counters are unreadable", "error", err)
		return
	}
	seen := make(map[int]linkSeen)
	for k := range out {
		l := out[k].Lease
		if l == nil || l.Slot == nil {
			continue
		}
		c, ok, err := links.Counts(l.Slot.HostIf)
		if err != nil || !ok {
			continue // gone meanwhile: the reconciler's pass settles it
		}
		u := l.Rec.Ledger.Usage(c, 0)
		out[k].Usage = &u
		seen[l.Rec.Index] = linkSeen{s.table.hostIfIndex(l.Slot), c}
	}
	s.table.seenAll(seen)
}

// seenInPass notes the link counters a reconcile pass's listing has of
// each intact slot of a lease (CheckLeased, before it makes any link
// again: a relink happens only there).
func (s *Service) seenInPass(links *account.NetDev, intact map[int]*slot.Slot) {
	if links == nil {
		return
	}
	seen := make(map[int]linkSeen, len(intact))
	for i, sl := range intact {
		if c, ok, err := links.Counts(sl.HostIf); err == nil && ok {
			seen[i] = linkSeen{sl.HostIfIndex, c}
		}
	}
	s.table.seenAll(seen)
}

// usageAttrs names usage u in a log line.
func usageAttrs(u account.Usage) []any {
	return []any{"bytes_in", u.BytesIn, "packets_in", u.PacketsIn, "bytes_out", u.BytesOut, "packets_out", u.PacketsOut,
		"dropped_packets", u.Dropped}
}

// linkSeen is a lease's link counters as last read, and the link they
// are of.
type linkSeen struct {
	ifindex int
	counts  account.Counts
}

// hostIfIndex is slot sl's host link: a relink changes it, under t.mu.
func (t *Table) hostIfIndex(sl *slot.Slot) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return sl.HostIfIndex
}

// seen notes c as the counters of host link ifindex, read for the lease
// at index i, when that link is still the lease's.
func (t *Table) seen(i, ifindex int, c account.Counts) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seenLocked(i, ifindex, c)
}

// seenAll is seen for each lease of seen, by index, with the link each
// had when it was copied.
func (t *Table) seenAll(seen map[int]linkSeen) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, s := range seen {
		t.seenLocked(i, s.ifindex, s.counts)
	}
}

func (t *Table) seenLocked(i, ifindex int, c account.Counts) {
	if l := t.leased[i]; l != nil && l.Slot != nil && l.Slot.HostIfIndex == ifindex {
		t.advance(&l.seen, linkSeen{ifindex: ifindex, counts: c})
	}
}

// advance moves a lease's last read of its link to now, adding what the
// link carried since the read before to the table's traffic. Call with
// t.mu held.
func (t *Table) advance(last *linkSeen, now linkSeen) {
	if last.ifindex == now.ifindex {
		t.traffic = t.traffic.Plus(now.counts.Minus(last.counts))
	}
	*last = now
}

// ended adds the last read of ended lease l's link, now, to the table's
// traffic.
func (t *Table) ended(l *Lease, now linkSeen) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advance(&l.seen, now)
}
