package nft

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os/exec"
	"slices"
	"testing"

	"github.com/google/nftables"

	"github.com/phasegate/phasegate/network/inside"
)

// A teardown of many leased slots at once (a reclaim, a decommission)
// removes every element and chain, whatever their number: at 10,000 the
// acknowledgements of one transaction overflowed the socket's buffer
// (ENOBUFS) and the teardown failed whole; the chains are removed in
// transactions of chainsPerTransaction.
func TestRemoveManyEgressChains(t *testing.T) {
	// A namespace of the test's own (package nettest imports this one).
	ns := fmt.Sprintf("nftt-%08x", rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v\n%s", ns, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	tbl, err := New("phasegate_nftt_", WithNetNS("/run/netns/"+ns), WithSlotNetwork(netip.MustParsePrefix("169.254.0.0/17")))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := tbl.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 10000
	var names []string
	for i := range n {
		names = append(names, fmt.Sprintf("nftt-h%d", i+1))
	}
	if err := tbl.Add(ctx, names...); err != nil {
		t.Fatal(err)
	}
	tbl.setEgressMany(t, names, inside.Policy{Deny: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}})
	if got, err := tbl.EgressNames(ctx); err != nil || len(got) != n {
		t.Fatalf("chains made: %d, %v", len(got), err)
	}
	if err := tbl.Remove(ctx, names...); err != nil {
		t.Fatalf("Remove of %d slots with their chains: %v", n, err)
	}
	if got, err := tbl.EgressNames(ctx); err != nil || len(got) != 0 {
		t.Errorf("egress chains left: %d, %v", len(got), err)
	}
	if got, err := tbl.List(ctx); err != nil || len(got) != 0 {
		t.Errorf("elements left: %d, %v", len(got), err)
	}
	if rules, err := tbl.RuleCount(ctx); err != nil || rules != FixedRules {
		t.Errorf("RuleCount after = %d, %v", rules, err)
	}
}

// setEgressMany writes p for every name as SetEgress does, a few hundred
// slots a transaction, where SetEgress takes one each: making 10,000
// chains one at a time would walk every chain made so far each time.
func (t *Table) setEgressMany(tb testing.TB, names []string, p inside.Policy) {
	tb.Helper()
	c, release, err := t.conn()
	if err != nil {
		tb.Fatal(err)
	}
	defer release()
	for part := range slices.Chunk(names, 200) {
		var els []nftables.SetElement
		for _, name := range part {
			ch := c.AddChain(&nftables.Chain{Name: EgressChain(name), Table: t.table()})
			rules, err := t.egressRules(c, p)
			if err != nil {
				tb.Fatal(err)
			}
			for _, r := range rules {
				c.AddRule(&nftables.Rule{Table: t.table(), Chain: ch, Exprs: r})
			}
			k, err := key(name)
			if err != nil {
				tb.Fatal(err)
			}
			els = append(els, jumpTo(k, name))
		}
		if err := c.SetAddElements(t.egressMap(), els); err != nil {
			tb.Fatal(err)
		}
		if err := c.Flush(); err != nil {
			tb.Fatalf("make chains: %v", err)
		}
	}
}
