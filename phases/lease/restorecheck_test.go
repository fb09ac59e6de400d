package lease

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/internal/leasetest"
)

// BenchmarkVerifyRestored measures the check after SERVING of restored
// leases' slots (Identify and RepairHost; nothing to repair) at each
// number of workers, in one run: their ratios chose VerifyWorkers
// (docs/BENCHMARKS.md, "Figures behind the network code", verifyWorkers).
func BenchmarkVerifyRestored(b *testing.B) {
	const n = 256
	_, mgr, _ := leasetest.NewSlotHost(b, n)
	ctx := context.Background()
	slots := make([]*slot.Slot, n)
	for i := range slots {
		s, err := mgr.Create(ctx, i+1)
		if err != nil {
			b.Fatal(err)
		}
		slots[i] = s
	}
	c := &RestoreCheck{Log: slog.New(slog.DiscardHandler), Mgr: mgr}
	recs := make([]leases.Record, n)
	for _, w := range []int{1, 2, 4, 8, 16} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			for b.Loop() {
				out, _ := c.checkSlots(ctx, slots, recs, w)
				for i, v := range out {
					if v != (verdict{}) {
						b.Fatalf("slot %d: %+v", slots[i].Index, v)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/lease")
		})
	}
}
