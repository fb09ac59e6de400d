package lease

import (
	"sync"

	"github.com/phasegate/phasegate/network/account"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
)

// leaseRequest is the Acquire request a lease answers: the owner and the
// client's request id.
type leaseRequest struct{ owner, id string }

// requestOf returns the request rec holds; ok is false for a lease taken
// without a request id (not idempotent, not indexed).
func requestOf(rec leases.Record) (leaseRequest, bool) {
	return leaseRequest{rec.Owner, rec.RequestID}, rec.RequestID != ""
}

// Table holds the lease core's leases: by slot index (lost ones
// included), by the Acquire request that took each, and the Acquires
// under way, by principal, counted against its quota.
//
// Its mutex guards the three maps and the fields of a held lease that
// change (rec, slot, lostReason, check, deferred): they are read under it,
// or from a copy taken under it. It is held for map and field operations
// only, never across a call to the kernel or the store.
//
// requests answers a retried Acquire without a read of the store: every
// lease record is written by the service or restored into the table at
// the start, and its owner and request id never change while it is held.
type Table struct {
	mu       sync.Mutex
	leased   map[int]*Lease
	requests map[leaseRequest]*Lease
	pending  map[string]int
	// traffic is what the leases' links carried while this process read
	// them (usage.go).
	traffic account.Counts
}

// NewTable returns a table holding the leases restored at a start.
func NewTable(restored []*Lease) *Table {
	t := &Table{leased: map[int]*Lease{}, requests: map[leaseRequest]*Lease{}, pending: map[string]int{}}
	for _, l := range restored {
		t.hold(l)
	}
	return t
}

// hold adds l to leased and requests. Call with t.mu held.
func (t *Table) hold(l *Lease) {
	t.leased[l.Rec.Index] = l
	if rq, ok := requestOf(l.Rec); ok {
		t.requests[rq] = l
	}
}

// unhold removes the lease of slot i from leased and requests, and
// returns it (nil if none). Call with t.mu held.
func (t *Table) unhold(i int) *Lease {
	l := t.leased[i]
	if l == nil {
		return nil
	}
	delete(t.leased, i)
	if rq, ok := requestOf(l.Rec); ok && t.requests[rq] == l {
		delete(t.requests, rq)
	}
	return l
}

// at returns the lease of slot i, nil if none: a pointer into the table,
// whose changing fields are read under t.mu.
func (t *Table) at(i int) *Lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.leased[i]
}

// copies returns a copy of every lease, by index.
func (t *Table) copies() map[int]*Lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[int]*Lease, len(t.leased))
	for i, l := range t.leased {
		c := *l
		out[i] = &c
	}
	return out
}

// copyAt returns a copy of the lease of slot i, taken under the lock, or
// nil if none.
func (t *Table) copyAt(i int) *Lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.leased[i]
	if cur == nil {
		return nil
	}
	c := *cur
	return &c
}

// copyOf returns a copy of held lease l, taken under the lock.
func (t *Table) copyOf(l *Lease) Lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	return *l
}

// add holds l.
func (t *Table) add(l *Lease) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.hold(l)
}

// Remove forgets the lease of slot i and returns it (nil if none).
func (t *Table) remove(i int) *Lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.unhold(i)
}

// setRecordOf replaces the record of rec's lease, if it is still held:
// one a Release and a new Acquire replaced meanwhile keeps its own.
func (t *Table) setRecordOf(rec leases.Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.leased[rec.Index]; l != nil && l.Rec.LeaseID == rec.LeaseID {
		l.Rec = rec
	}
}

// reserve counts an Acquire under way against its principal's quota of
// leases (0: none), with the leases it holds; done ends the reservation,
// once the lease is held or the Acquire failed.
func (t *Table) reserve(principal string, quota int) (done func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if quota > 0 {
		held := t.pending[principal]
		for _, l := range t.leased {
			if l.Rec.Principal == principal {
				held++
			}
		}
		if held >= quota {
			return nil, Errorf(ErrExhausted, "%s holds %d leases, its quota (--max-leases, or max_leases in the control policy; unless either says, a quarter of --slots): release one first", principal, held)
		}
	}
	t.pending[principal]++
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.pending[principal]--; t.pending[principal] == 0 {
			delete(t.pending, principal)
		}
	}, nil
}

// byRequest finds the lease an earlier Acquire of this request took, lost
// ones included.
func (t *Table) byRequest(owner, requestID string) (*Lease, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.requests[leaseRequest{owner, requestID}]
	return l, ok
}

// counts returns how many leases are held and how many of them are lost.
func (t *Table) counts() (held, lost int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, l := range t.leased {
		if l.Slot == nil {
			lost++
		}
	}
	return len(t.leased), lost
}

// slotOwning returns the index of the leased slot whose own namespace is
// id.
func (t *Table) slotOwning(id netns.ID) (int, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, l := range t.leased {
		if l.Slot != nil && l.Slot.NetnsID == id {
			return i, true
		}
	}
	return 0, false
}
