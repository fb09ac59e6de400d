package lease

import (
	"context"
	"testing"
	"time"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/phases/internal/leasetest"
)

// The expiry rule, case by case: a lease past its deadline expires only
// once a whole TTL has passed since the daemon last could not take its
// principal's calls, and never while it cannot.
func TestExpiryDeferredWhileImpaired(t *testing.T) {
	now := time.Unix(10_000, 0)
	const ttl = 6 * time.Second
	rec := leases.Record{Principal: "uid:0", TTL: ttl, Expires: now.Add(-time.Second)}
	never := time.Time{}
	for _, tc := range []struct {
		name     string
		last     time.Time // the surface's last Impairment
		ongoing  bool
		stalled  time.Time // the expiry loop's last late pass
		deferred bool
	}{
		{"never impaired", never, false, never, false},
		{"impaired now", now.Add(-time.Minute), true, never, true},
		{"impaired within the TTL", now.Add(-2 * time.Second), false, never, true},
		{"impaired a TTL ago", now.Add(-ttl), false, never, false},
		{"impaired long ago", now.Add(-time.Hour), false, never, false},
		{"the daemon did not run within the TTL", never, false, now.Add(-time.Second), true},
		{"the later of the two counts", now.Add(-time.Hour), false, now.Add(-5 * time.Second), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Service{impaired: func(p string) (time.Time, bool) {
				if p != rec.Principal {
					t.Errorf("Impairment asked for %q, want the lease's principal %q", p, rec.Principal)
				}
				return tc.last, tc.ongoing
			}}
			if !tc.stalled.IsZero() {
				s.stalled.Store(tc.stalled.UnixNano())
			}
			if got := s.expiryDeferred(rec, now); got != tc.deferred {
				t.Errorf("expiryDeferred = %v, want %v", got, tc.deferred)
			}
		})
	}
}

// On real slots and records: a lease whose deadline passes while the
// daemon cannot take calls is kept, with its slot and its record, for a
// TTL after the daemon can again, and then expires as any other.
func TestLeaseOutlivesAnImpairedWindow(t *testing.T) {
	r := newRig(t, 4, 1)
	var last time.Time
	ongoing := true
	r.svc.impaired = func(string) (time.Time, bool) { return last, ongoing }
	ctx := context.Background()
	const ttl = 2 * time.Second
	a, err := r.svc.Acquire(ctx, leasetest.CallerOf(leasetest.Root, nil), Request{Owner: "o", RequestID: "r", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	i := a.Lease.Rec.Index
	held := func() bool {
		rec, ok, err := r.store.Get(i)
		l := r.svc.At(i)
		return err == nil && ok && rec.State == leases.Leased && rec.LeaseID == a.Lease.Rec.LeaseID && l != nil
	}
	deadline := time.Now().Add(ttl)
	for _, step := range []struct {
		what    string
		at      time.Time
		ongoing bool
		last    time.Time
		expired bool
	}{
		{"a minute past the deadline, impaired throughout", deadline.Add(time.Minute), true, deadline, false},
		{"the window ended half a TTL ago", deadline.Add(time.Minute + ttl/2), false, deadline.Add(time.Minute), false},
		{"the window ended a TTL ago", deadline.Add(time.Minute + ttl), false, deadline.Add(time.Minute), true},
	} {
		ongoing, last = step.ongoing, step.last
		n := r.svc.expire(ctx, step.at)
		if (n == 1) != step.expired || held() == step.expired {
			t.Fatalf("%s: %d expired, held %v; want expired %v", step.what, n, held(), step.expired)
		}
	}
}

// KindOf tells the surface of a recorded principal.
func TestKindOfRecordedPrincipal(t *testing.T) {
	for in, want := range map[string]control.Kind{
		"uid:0": control.Unix, "uid:65534": control.Unix,
		"x509:uri:spiffe://x/ns/ci/sa/builder": control.URISAN, "x509:dns:b.example.org": control.DNSSAN,
		"x509:cn:builder": control.CommonName, "legacy:x509:spiffe://x": 0, "x509:spiffe://x": 0, "anonymous": 0, "": 0,
	} {
		if got := control.KindOf(in); got != want {
			t.Errorf("KindOf(%q) = %v, want %v", in, got, want)
		}
	}
}
