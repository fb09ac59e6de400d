package lease

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// BenchmarkCheckLeased is what a reconcile pass adds to its survey to see
// leased slots broken from outside: 10,000 leases, every slot intact, as
// the survey of the host shows them (a map lookup each, under the
// lease table's lock, and no system call).
func BenchmarkCheckLeased(b *testing.B) {
	const n = 10000
	cfg := slot.Config{Prefix: "pb-", NetnsDir: "/run/netns", Slots: n, CIDR: netip.MustParsePrefix("100.64.0.0/17")}
	sr := &slot.ScanResult{Inventory: slot.Inventory{}, Bound: map[int]netns.ID{}}
	var held []*Lease
	acquired := time.Now().Add(-time.Hour)
	for i := 1; i <= n; i++ {
		s := cfg.Slot(i)
		s.NetnsID = netns.ID{Dev: 4, Ino: uint64(4026532000 + i)}
		sr.Inventory[i] = slot.All
		sr.Bound[i] = s.NetnsID
		held = append(held, &Lease{Rec: leases.Record{Index: i, State: leases.Leased, Owner: "o", LeaseID: leases.NewLeaseID(), Acquired: acquired}, Slot: &s})
	}
	svc := &Service{cfg: cfg, table: NewTable(held), breaks: &breaks{}}
	ctx := context.Background()
	for b.Loop() {
		svc.CheckLeased(ctx, sr, time.Now())
	}
}
