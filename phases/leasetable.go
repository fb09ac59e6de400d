package phases

import (
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

// hold adds l to leased and requests. Call with s.mu held.
func (s *slotsService) hold(l *lease) {
	s.leased[l.rec.Index] = l
	if rq, ok := requestOf(l.rec); ok {
		s.requests[rq] = l
	}
}

// unhold removes the lease of slot i from leased and requests, and
// returns it (nil if none). Call with s.mu held.
func (s *slotsService) unhold(i int) *lease {
	l := s.leased[i]
	if l == nil {
		return nil
	}
	delete(s.leased, i)
	if rq, ok := requestOf(l.rec); ok && s.requests[rq] == l {
		delete(s.requests, rq)
	}
	return l
}

// reserve counts an Acquire under way against its principal's quota of
// leases (0: none), with the leases it holds; done ends the reservation,
// once the lease is held or the Acquire failed.
func (s *slotsService) reserve(principal string, quota int) (done func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if quota > 0 {
		held := s.pending[principal]
		for _, l := range s.leased {
			if l.rec.Principal == principal {
				held++
			}
		}
		if held >= quota {
			return nil, status.Errorf(codes.ResourceExhausted, "%s holds %d leases, its quota (--max-leases, or max_leases in the control policy): release one first", principal, held)
		}
	}
	s.pending[principal]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.pending[principal]--; s.pending[principal] == 0 {
			delete(s.pending, principal)
		}
	}, nil
}

// byRequest finds the lease an earlier Acquire of this request took, lost
// ones included.
func (s *slotsService) byRequest(owner, requestID string) (*lease, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.requests[leaseRequest{owner, requestID}]
	return l, ok
}

// counts returns how many leases are held and how many of them are lost.
func (s *slotsService) counts() (held, lost int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.leased {
		if l.slot == nil {
			lost++
		}
	}
	return len(s.leased), lost
}
