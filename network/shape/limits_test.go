package shape_test

import (
	"errors"
	"testing"

	"github.com/phasegate/phasegate/network/shape"
)

func TestValidate(t *testing.T) {
	const m = 1_000_000
	for _, tc := range []struct {
		name string
		l    shape.Limits
		ok   bool
	}{
		{"both ways", shape.Limits{IngressRate: 40 * m, IngressBurst: 1 * m, EgressRate: 20 * m, EgressBurst: 1 * m}, true},
		{"in only", shape.Limits{IngressRate: 40 * m, IngressBurst: 1 * m}, true},
		{"out only, default burst", shape.Limits{EgressRate: 40 * m}, true},
		{"least rate", shape.Limits{IngressRate: shape.MinRate}, true},
		{"greatest rate", shape.Limits{IngressRate: shape.MaxRate}, true},
		{"all zero", shape.Limits{}, false},
		{"burst without rate", shape.Limits{IngressBurst: 1 * m}, false},
		{"rate below the least", shape.Limits{EgressRate: shape.MinRate - 1}, false},
		{"absurd rate", shape.Limits{EgressRate: 1 << 63}, false},
		{"burst below a frame", shape.Limits{IngressRate: 40 * m, IngressBurst: 100}, false},
		{"absurd burst", shape.Limits{IngressRate: shape.MaxRate, IngressBurst: 1 << 40}, false},
		{"burst of minutes", shape.Limits{IngressRate: shape.MinRate, IngressBurst: shape.MinRate * shape.MaxBurstTime}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.WithDefaults().Validate()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, shape.ErrInvalid)) {
				t.Errorf("Validate(%v) = %v, want ok %t", tc.l, err, tc.ok)
			}
		})
	}
}

func TestDefaultBurst(t *testing.T) {
	for _, tc := range []struct{ rate, want uint64 }{
		{shape.MinRate, shape.DefaultBurstMin},
		{40_000_000, 800_000},
		{1_000_000_000, 20_000_000},
	} {
		if got := shape.DefaultBurst(tc.rate); got != tc.want {
			t.Errorf("DefaultBurst(%d) = %d, want %d", tc.rate, got, tc.want)
		}
	}
	l := shape.Limits{IngressRate: 40_000_000}.WithDefaults()
	if l.IngressBurst != 800_000 || l.EgressBurst != 0 {
		t.Errorf("WithDefaults gave %+v", l)
	}
}
