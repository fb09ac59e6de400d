package leases

import (
	"context"
	"errors"
	"testing"

	"github.com/phasegate/phasegate/network/shape"
)

// limited is a lease's bandwidth limits, as the lease core records them
// (bursts with their defaults).
func limited() *shape.Limits {
	return &shape.Limits{IngressRate: 40_000_000, IngressBurst: 800_000, EgressRate: 8_000, EgressBurst: shape.DefaultBurstMin}
}

// A record is data: limits no client could set are refused, as is a
// record other than a lease that has any.
func TestStoredBandwidthIsChecked(t *testing.T) {
	s := openTemp(t)
	for _, tc := range []struct {
		name string
		rec  Record
	}{
		{"idle with bandwidth", func() Record { r := idle(5); r.Bandwidth = limited(); return r }()},
		{"bandwidth all zero", func() Record { r := policied(5); r.Bandwidth = &shape.Limits{}; return r }()},
		{"burst without rate", func() Record { r := policied(5); r.Bandwidth.EgressRate = 0; return r }()},
		{"rate beyond the greatest", func() Record { r := policied(5); r.Bandwidth.IngressRate = shape.MaxRate + 1; return r }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.Put(context.Background(), tc.rec); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Put: %v, want ErrInvalid", err)
			}
		})
	}
}
