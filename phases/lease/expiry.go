package lease

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/leases"
)

// A lease with a TTL ends when its owner does not renew it in time. But
// an owner can renew only while the daemon takes its calls: a daemon out
// of descriptors, shedding connections over its total bound, or not
// running at all (stopped, starved) cannot, through no fault of the
// owner. So the rule (docs/DESIGN.md §10, "Expiry while impaired"):
//
//	a lease expires once its deadline has passed and a whole TTL has
//	passed since the daemon last could not take its principal's calls;
//	while it cannot, no lease expires.
//
// Its owner has then had a whole TTL of a reachable daemon to renew it in,
// which is what the TTL promised; a lease whose deadline fell in or just
// after an impaired window gets a TTL of grace from the window's end. The
// daemon is impaired for a principal when the surface it calls on (the
// control socket for uid:, the port for x509:) failed an accept for want
// of descriptors or refused a connection over its total bound
// (server.ConnStats), or when the expiry loop itself ran late (the process
// did not run). A connection refused over its peer's own bound does not
// count: that peer holds its share already.

// Impairment says when the daemon last could not take the calls of
// principal, and whether it cannot now.
type Impairment func(principal string) (last time.Time, now bool)

// expiryDeferred reports whether rec, past its deadline at now, must not
// expire yet by the rule above.
func (s *Service) expiryDeferred(rec leases.Record, now time.Time) bool {
	var last time.Time
	var ongoing bool
	if s.impaired != nil {
		last, ongoing = s.impaired(rec.Principal)
	}
	if ns := s.stalled.Load(); ns != 0 {
		if st := time.Unix(0, ns); st.After(last) {
			last = st
		}
	}
	return ongoing || !last.IsZero() && now.Before(last.Add(rec.TTL))
}

// expire ends every lease whose TTL ran out (and whose expiry is not
// deferred): logged, counted, traced, and its slot reclaimed. It returns
// how many it ended.
func (s *Service) expire(ctx context.Context, now time.Time) int {
	s.table.mu.Lock()
	var due, deferred []Lease // copies: a renewal may change a lease's record meanwhile
	for _, l := range s.table.leased {
		switch {
		case !l.Rec.Expired(now):
			l.deferred = false
		case s.expiryDeferred(l.Rec, now):
			if !l.deferred {
				l.deferred = true
				deferred = append(deferred, *l)
			}
		default:
			due = append(due, *l)
		}
	}
	s.table.mu.Unlock()
	for _, l := range deferred {
		s.count("expiry_deferred")
		s.log.Warn("lease expiry deferred: the daemon could not take its owner's calls within its TTL; it expires a TTL after the daemon can again, unless renewed",
			"slot", l.Rec.Index, "owner", names.Shown(l.Rec.Owner), "ttl", l.Rec.TTL.String(),
			"deadline", now.Sub(l.Rec.Expires).Round(time.Millisecond).String()+" ago")
	}
	n := 0
	for _, l := range due {
		if s.expireOne(ctx, l, now) {
			n++
		}
	}
	return n
}

// expireOne ends lease l (a copy taken by the scan) if its record is
// still the lease's and still past its deadline (a renewal may have come
// since the scan).
func (s *Service) expireOne(ctx context.Context, l Lease, now time.Time) bool {
	_, span := s.tracer.Start(ctx, "lease expired", trace.WithAttributes(
		attribute.Int("phasegate.slot", l.Rec.Index), attribute.String("phasegate.owner", names.Shown(l.Rec.Owner)),
		attribute.String("phasegate.ttl", l.Rec.TTL.String())))
	defer span.End()
	i := l.Rec.Index
	_, err := s.records.update(ctx, i, func(r *leases.Record) error {
		if r.State != leases.Leased || !sameLease(r.LeaseID, l.Rec.LeaseID) || !r.Expired(now) {
			return leases.ErrNotFound // released or renewed meanwhile
		}
		return leases.ErrRemove
	})
	if err != nil {
		return false
	}
	ended := s.table.remove(i)
	u := s.giveBack(ctx, ended)
	s.count("expired")
	s.log.Warn("lease expired: not kept alive within its TTL; slot reclaimed", append([]any{"slot", i, "owner", names.Shown(l.Rec.Owner),
		"ttl", l.Rec.TTL.String(), "expired", now.Sub(l.Rec.Expires).Round(time.Millisecond).String() + " ago"}, usageAttrs(u)...)...)
	return true
}

// RunExpiry ends expired leases every interval until ctx ends. A pass that
// comes much later than due means the daemon did not run meanwhile: that
// counts as impaired.
func (s *Service) RunExpiry(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := time.Now()
		if now.Sub(last) > 2*interval {
			s.stalled.Store(now.UnixNano())
			s.log.Warn("lease expiry ran late: the daemon did not run; leases get a TTL of grace", "late", (now.Sub(last) - interval).Round(time.Millisecond).String())
		}
		last = now
		s.expire(ctx, now)
	}
}
