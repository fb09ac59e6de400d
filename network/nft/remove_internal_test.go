package nft

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os/exec"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/google/nftables"

	"github.com/phasegate/phasegate/network/egress"
)

// A teardown of many leased slots at once (a reclaim, a decommission)
// removes every element and chain, whatever their number: at 10,000 the
// acknowledgements of one transaction overflowed the socket's buffer
// (ENOBUFS) and the teardown failed whole; the chains are removed in
// transactions of chainsPerTx (root's: chainsPerBigTransaction).
func TestRemoveManyEgressChains(t *testing.T) {
	tbl := privateTable(t)
	ctx := context.Background()
	const n = 10000
	var names []string
	for i := range n {
		names = append(names, fmt.Sprintf("nftt-h%d", i+1))
	}
	if err := tbl.Add(ctx, names...); err != nil {
		t.Fatal(err)
	}
	tbl.setEgressMany(t, names, egress.Policy{Deny: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}})
	if got, err := tbl.EgressNames(ctx); err != nil || len(got) != n {
		t.Fatalf("chains made: %d, %v", len(got), err)
	}
	if err := tbl.Remove(ctx, names...); err != nil {
		t.Fatalf("Remove of %d slots with their chains: %v", n, err)
	}
	if !tbl.bigBuf.Load() {
		t.Error("root's socket buffer was not forced: the chains went 128 a transaction")
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

// privateTable is a slot table, ensured, in a namespace of the test's own
// (package nettest imports this one).
func privateTable(tb testing.TB) *Table {
	tb.Helper()
	ns := fmt.Sprintf("nftt-%08x", rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		tb.Fatalf("ip netns add %s: %v\n%s", ns, err, out)
	}
	tb.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	tbl, err := New("phasegate_nftt_", WithNetNS("/run/netns/"+ns), WithSlotNetwork(netip.MustParsePrefix("169.254.0.0/17")))
	if err != nil {
		tb.Fatal(err)
	}
	if err := tbl.Ensure(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return tbl
}

// setEgressMany writes p for every name as SetEgress does, a few hundred
// slots a transaction, where SetEgress takes one each: making 10,000
// chains one at a time would walk every chain made so far each time.
func (t *Table) setEgressMany(tb testing.TB, names []string, p egress.Policy) {
	tb.Helper()
	c, release, err := t.conn()
	if err != nil {
		tb.Fatal(err)
	}
	defer release()
	for part := range slices.Chunk(names, 200) {
		var els []nftables.SetElement
		var ids setIDs
		for _, name := range part {
			ch := c.AddChain(&nftables.Chain{Name: EgressChain(name), Table: t.table()})
			rules, err := t.egressRules(c, &ids, p)
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

// BenchmarkSetEgressAtScale measures a slot's policy change with n other
// slots' chains in the table: its first policy (the map gains a jump, and
// the kernel walks every chain at the commit), a replacement (the chain
// rewritten, its jump kept), a release of its element and chain (Remove),
// the defensive clear of a new slot (AddNew, nothing to clear), and
// replacements by 16 callers at once, each on a slot of its own (their
// changes share transactions: group).
//
//	go test -run '^$' -bench SetEgressAtScale -count 3 ./network/nft/
func BenchmarkSetEgressAtScale(b *testing.B) {
	p := egress.Policy{Allow: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, Deny: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}
	for _, n := range []int{0, 1000, 10000} {
		b.Run(fmt.Sprintf("chains=%d", n), func(b *testing.B) {
			tbl := privateTable(b)
			ctx := context.Background()
			var others []string
			for i := range n {
				others = append(others, fmt.Sprintf("nftt-h%d", i+1))
			}
			if n > 0 {
				if err := tbl.Add(ctx, others...); err != nil {
					b.Fatal(err)
				}
				tbl.setEgressMany(b, others, p)
			}
			b.Run("op=replace-16-callers", func(b *testing.B) {
				var next atomic.Int32
				b.SetParallelism(8) // 16 callers on 2 cores
				b.RunParallel(func(pb *testing.PB) {
					name := fmt.Sprintf("nftt-p%d", next.Add(1))
					for pb.Next() {
						if err := tbl.SetEgress(ctx, name, p); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
			for _, op := range []string{"first", "replace", "remove", "addnew"} {
				b.Run("op="+op, func(b *testing.B) {
					for k := range b.N {
						name := fmt.Sprintf("nftt-x%d", k%1000)
						switch op {
						case "first", "replace":
							if op == "first" {
								b.StopTimer()
								if err := tbl.Remove(ctx, name); err != nil {
									b.Fatal(err)
								}
								b.StartTimer()
							}
							if err := tbl.SetEgress(ctx, name, p); err != nil {
								b.Fatal(err)
							}
						case "remove":
							b.StopTimer()
							if err := tbl.SetEgress(ctx, name, p); err != nil {
								b.Fatal(err)
							}
							b.StartTimer()
							if err := tbl.Remove(ctx, name); err != nil {
								b.Fatal(err)
							}
						case "addnew":
							if err := tbl.AddNew(ctx, name); err != nil {
								b.Fatal(err)
							}
						}
					}
				})
			}
		})
	}
}
