package slot_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/slot"
)

// leakWithEgress leaks slots 1..n, the first withEgress of them with an
// egress chain, and returns the inventory a scan finds then.
func leakWithEgress(t *testing.T, m *slot.Manager, n, withEgress int) slot.Inventory {
	t.Helper()
	ctx := context.Background()
	var idx []int
	for i := 1; i <= n; i++ {
		idx = append(idx, i)
	}
	nettest.Leak(t, m, idx)
	pol := egress.Policy{Deny: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}
	for i := 1; i <= withEgress; i++ {
		if err := m.Firewall().SetEgress(ctx, m.Config().HostIfName(i), pol); err != nil {
			t.Fatal(err)
		}
	}
	inv, err := m.Scan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// firewallOf returns the set's elements and the egress chains' names.
func firewallOf(t *testing.T, m *slot.Manager) (els, chains []string) {
	t.Helper()
	ctx := context.Background()
	els, err := m.Firewall().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	chains, err = m.Firewall().EgressNames(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return els, chains
}

// With TableGoes (a decommission) the slots go and their elements and
// egress chains stay for the table's deletion, one transaction; a scan
// then finds nothing of them.
func TestTeardownTableGoes(t *testing.T) {
	env := nettest.New(t, 8)
	m := env.Manager(t)
	ctx := context.Background()
	inv := leakWithEgress(t, m, 3, 2)
	res := m.Teardown(ctx, inv, slot.TeardownOptions{TableGoes: true})
	if err := res.Err(); err != nil || !slices.Equal(res.Reclaimed, []int{1, 2, 3}) {
		t.Fatalf("teardown: %v, reclaimed %v", err, res.Reclaimed)
	}
	if links := nettest.HostLinks(t, m.Config().HostIfPrefix()); len(links) != 0 {
		t.Errorf("host links left: %v", links)
	}
	if els, chains := firewallOf(t, m); len(els) != 3 || len(chains) != 2 {
		t.Errorf("the firewall was touched: elements %v, chains %v", els, chains)
	}
	if err := m.Firewall().Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if inv, err := m.Scan(ctx); err != nil || len(inv.Indices()) != 0 {
		t.Errorf("after the table: %v, %v", inv.Indices(), err)
	}
}

// A teardown in which some slots' firewall objects are already gone (an
// earlier teardown removed them, then failed before its records went)
// removes the others' in the same transactions and fails no slot.
func TestTeardownSomeFirewallObjectsGone(t *testing.T) {
	env := nettest.New(t, 8)
	m := env.Manager(t)
	ctx := context.Background()
	inv := leakWithEgress(t, m, 4, 3)
	c := m.Config()
	// Slot 2's chain and slot 3's element and chain go after the scan.
	if err := m.Firewall().ClearEgress(ctx, c.HostIfName(2)); err != nil {
		t.Fatal(err)
	}
	if err := m.Firewall().Remove(ctx, c.HostIfName(3)); err != nil {
		t.Fatal(err)
	}
	res := m.Teardown(ctx, inv, slot.TeardownOptions{})
	if err := res.Err(); err != nil || !slices.Equal(res.Reclaimed, []int{1, 2, 3, 4}) {
		t.Fatalf("teardown: %v, reclaimed %v, failed %v", err, res.Reclaimed, res.Failed)
	}
	if els, chains := firewallOf(t, m); len(els) != 0 || len(chains) != 0 {
		t.Errorf("left: elements %v, chains %v", els, chains)
	}
}
