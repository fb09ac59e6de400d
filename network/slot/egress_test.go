package slot_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/inside"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// A lease's egress policy is written on both sides and goes with the slot:
// InspectEgress reads the same fingerprint on the host and inside, a slot
// whose own table its root has broken gets it replaced whole, and a slot
// destroyed and made again at the index has no policy on either side.
func TestEgressOnBothSidesGoesWithTheSlot(t *testing.T) {
	e := nettest.New(t, 2)
	d := egress.Defaults{AlwaysDeny: egress.DefaultAlwaysDeny}
	ctx := context.Background()
	m, err := slot.NewManager(ctx, e.Config, slot.Options{Egress: d})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Firewall().Delete(context.Background()) })
	s, err := m.Create(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	p := egress.Policy{Allow: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
	if err := m.ApplyEgress(ctx, s, p); err != nil {
		t.Fatal(err)
	}
	want := p.Fingerprint(d)
	if st, err := m.InspectEgress(ctx, s); err != nil || st.Host != want || st.Inside != want {
		t.Fatalf("InspectEgress = %+v, %v; want %s on both sides", st, err, want)
	}

	// Root in the slot makes the table's set a different type: the next
	// write would fail on it, so the table is replaced.
	fd, err := netns.Open(s.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	tbl := &nftables.Table{Name: inside.EgressTable, Family: nftables.TableFamilyINet}
	c.DelTable(tbl)
	c.AddTable(tbl)
	if err := c.AddSet(&nftables.Set{Table: tbl, Name: "allow", KeyType: nftables.TypeInetService}, nil); err != nil {
		t.Fatal(err)
	}
	err = c.Flush()
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	p2 := egress.Policy{DenyAll: true}
	if err := m.ApplyEgress(ctx, s, p2); err != nil {
		t.Fatalf("ApplyEgress over a table the slot's root broke: %v", err)
	}
	if st, err := m.InspectEgress(ctx, s); err != nil || st.Host != p2.Fingerprint(d) || st.Inside != p2.Fingerprint(d) {
		t.Errorf("after the replacement InspectEgress = %+v, %v", st, err)
	}

	if err := m.Destroy(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if names, err := m.Firewall().EgressNames(ctx); err != nil || len(names) != 0 {
		t.Errorf("egress chains left after Destroy: %q, %v", names, err)
	}
	if err := m.ApplyEgress(ctx, s, p); err == nil {
		t.Errorf("ApplyEgress on a destroyed slot succeeded")
	}
	// The host's chain that write left under the name is the next slot's
	// to clear.
	s2, err := m.Create(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := m.InspectEgress(ctx, s2); err != nil || st.Host != "" || st.Inside != "" {
		t.Errorf("a new slot at the index has a policy: %+v, %v", st, err)
	}
	if err := m.ClearEgress(ctx, s2); err != nil {
		t.Errorf("ClearEgress of a slot without a policy: %v", err)
	}
}
