package lease

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/account"
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
	netDev := bytes.NewBufferString("Inter-|   Receive |  Transmit\n face |bytes packets ...\n")
	for i := 1; i <= n; i++ {
		s := cfg.Slot(i)
		s.NetnsID, s.HostIfIndex = netns.ID{Dev: 4, Ino: uint64(4026532000 + i)}, 100+i
		sr.Inventory[i] = slot.All
		sr.Bound[i] = s.NetnsID
		held = append(held, &Lease{Rec: leases.Record{Index: i, State: leases.Leased, Owner: "o", LeaseID: leases.NewLeaseID(), Acquired: acquired}, Slot: &s})
		fmt.Fprintf(netDev, "%s: %d %d 0 0 0 0 0 0 %d %d 0 0 0 0 0 0\n", s.HostIf, 1000*i, i, 2000*i, 2*i)
	}
	links, err := account.ParseNetDev(netDev.Bytes())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	// "no counters" is the pass as it was before a lease's usage: the
	// scan's listing without the links' counters.
	for _, bc := range []struct {
		name  string
		links *account.NetDev
	}{{"no counters", nil}, {"counters", links}} {
		b.Run(bc.name, func(b *testing.B) {
			sr.Links = bc.links
			svc := &Service{cfg: cfg, table: NewTable(held), breaks: &breaks{}}
			for b.Loop() {
				svc.CheckLeased(ctx, sr, time.Now())
			}
		})
	}
}
