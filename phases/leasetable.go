package phases

import (
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/network/leases"
)

// leaseRequest is the Acquire request a lease answers: the owner and the
// client's request id.
type leaseRequest struct{ owner, id string }

// requestOf returns the request rec holds; ok is false for a lease taken
// without a request id (not idempotent, not indexed).
func requestOf(rec leases.Record) (leaseRequest, bool) {
	return leaseRequest{rec.Owner, rec.RequestID}, rec.RequestID != ""
}

// leaseTable holds the Slots service's leases: by slot index (lost ones
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
type leaseTable struct {
	mu       sync.Mutex
	leased   map[int]*lease
	requests map[leaseRequest]*lease
	pending  map[string]int
}

// newLeaseTable returns a table holding the leases restored at a start.
func newLeaseTable(restored []*lease) *leaseTable {
	t := &leaseTable{leased: map[int]*lease{}, requests: map[leaseRequest]*lease{}, pending: map[string]int{}}
	for _, l := range restored {
		t.hold(l)
	}
	return t
}

// hold adds l to leased and requests. Call with t.mu held.
func (t *leaseTable) hold(l *lease) {
	t.leased[l.rec.Index] = l
	if rq, ok := requestOf(l.rec); ok {
		t.requests[rq] = l
	}
}

// unhold removes the lease of slot i from leased and requests, and
// returns it (nil if none). Call with t.mu held.
func (t *leaseTable) unhold(i int) *lease {
	l := t.leased[i]
	if l == nil {
		return nil
	}
	delete(t.leased, i)
	if rq, ok := requestOf(l.rec); ok && t.requests[rq] == l {
		delete(t.requests, rq)
	}
	return l
}

// at returns the lease of slot i, nil if none: a pointer into the table,
// whose changing fields are read under t.mu.
func (t *leaseTable) at(i int) *lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.leased[i]
}

// copies returns a copy of every lease, by index.
func (t *leaseTable) copies() map[int]*lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[int]*lease, len(t.leased))
	for i, l := range t.leased {
		c := *l
		out[i] = &c
	}
	return out
}

// copyAt returns a copy of the lease of slot i, taken under the lock, or
// nil if none.
func (t *leaseTable) copyAt(i int) *lease {
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
func (t *leaseTable) copyOf(l *lease) lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	return *l
}

// add holds l.
func (t *leaseTable) add(l *lease) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.hold(l)
}

// remove forgets the lease of slot i and returns it (nil if none).
func (t *leaseTable) remove(i int) *lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.unhold(i)
}

// setRecord replaces the record of slot i's lease, if it is still held.
func (t *leaseTable) setRecord(i int, rec leases.Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.leased[i]; l != nil {
		l.rec = rec
	}
}

// reserve counts an Acquire under way against its principal's quota of
// leases (0: none), with the leases it holds; done ends the reservation,
// once the lease is held or the Acquire failed.
func (t *leaseTable) reserve(principal string, quota int) (done func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if quota > 0 {
		held := t.pending[principal]
		for _, l := range t.leased {
			if l.rec.Principal == principal {
				held++
			}
		}
		if held >= quota {
			return nil, status.Errorf(codes.ResourceExhausted, "%s holds %d leases, its quota (--max-leases, or max_leases in the control policy; unless either says, a quarter of --slots): release one first", principal, held)
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
func (t *leaseTable) byRequest(owner, requestID string) (*lease, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.requests[leaseRequest{owner, requestID}]
	return l, ok
}

// counts returns how many leases are held and how many of them are lost.
func (t *leaseTable) counts() (held, lost int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, l := range t.leased {
		if l.slot == nil {
			lost++
		}
	}
	return len(t.leased), lost
}
