package nftexpr

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

func TestIntervalElements(t *testing.T) {
	type el struct {
		key string
		end bool
	}
	for _, tc := range []struct {
		name string
		in   []string
		want []el
	}{
		{"one", []string{"10.0.0.0/8"}, []el{{"10.0.0.0", false}, {"11.0.0.0", true}}},
		{"a /32", []string{"1.1.1.1/32"}, []el{{"1.1.1.1", false}, {"1.1.1.2", true}}},
		{"adjacent merged", []string{"10.0.1.0/24", "10.0.0.0/24"}, []el{{"10.0.0.0", false}, {"10.0.2.0", true}}},
		{"contained merged", []string{"10.0.0.0/8", "10.1.0.0/16"}, []el{{"10.0.0.0", false}, {"11.0.0.0", true}}},
		{"ending at the top: no end element (no overflow to 0.0.0.0)", []string{"240.0.0.0/4"}, []el{{"240.0.0.0", false}}},
		{"the last address", []string{"255.255.255.255/32"}, []el{{"255.255.255.255", false}}},
		{"top merged with its neighbour", []string{"224.0.0.0/4", "240.0.0.0/4"}, []el{{"224.0.0.0", false}}},
		{"from zero", []string{"0.0.0.0/8", "127.0.0.0/8"}, []el{{"0.0.0.0", false}, {"1.0.0.0", true}, {"127.0.0.0", false}, {"128.0.0.0", true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ps []netip.Prefix
			for _, s := range tc.in {
				ps = append(ps, netip.MustParsePrefix(s))
			}
			got := IntervalElements(ps)
			if len(got) != len(tc.want) {
				t.Fatalf("%d elements %v, want %v", len(got), got, tc.want)
			}
			for i, e := range got {
				var b [4]byte
				binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(e.Key))
				if a := netip.AddrFrom4(b).String(); a != tc.want[i].key || e.IntervalEnd != tc.want[i].end {
					t.Errorf("element %d: %s end=%t, want %s end=%t", i, a, e.IntervalEnd, tc.want[i].key, tc.want[i].end)
				}
			}
		})
	}
}
