package ports_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/phasegate/phasegate/network/internal/fakehost"
	"github.com/phasegate/phasegate/network/ports"
)

// BenchmarkPublish measures one mapping's add (Set of one slot's single
// mapping, route_localnet on its host end included) into maps that hold
// already 10 or 10,000 mappings of other slots. docs/BENCHMARKS.md,
// "Published ports".
func BenchmarkPublish(b *testing.B) {
	for _, n := range []int{10, 10000} {
		b.Run(fmt.Sprintf("beside=%d", n), func(b *testing.B) {
			h := fakehost.New(b, 1, true)
			_, pt := portsOf(b, h)
			ctx := context.Background()
			var others []ports.Mapping
			for i := range n {
				others = append(others, ports.Mapping{HostPort: uint16(20000 + i), SlotPort: 80, Protocol: ports.TCP})
			}
			if err := pt.Set(ctx, "", netip.MustParseAddr("10.255.0.1"), nil, others); err != nil {
				b.Fatal(err)
			}
			s := h.Slots[0]
			one := []ports.Mapping{{HostPort: 8080, SlotPort: 80, Protocol: ports.TCP}}
			b.ResetTimer()
			for b.Loop() {
				if err := pt.Set(ctx, s.HostIf, s.InsideAddr.Addr(), nil, one); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := pt.Set(ctx, "", s.InsideAddr.Addr(), one, nil); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
