package nft

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/egress"
)

// Policies written at once by many callers go in shared transactions
// (group), and each slot gets its own: its fingerprint, and the sets of
// its long lists holding its ranges and no other slot's (a rule names an
// anonymous set of its transaction by an id).
func TestConcurrentPoliciesEachGetTheirOwn(t *testing.T) {
	tbl := privateTable(t)
	ctx := context.Background()
	const n = 48
	names := make([]string, n)
	policies := make([]egress.Policy, n)
	for i := range n {
		names[i] = fmt.Sprintf("nftt-h%d", i+1)
		policies[i] = policyOf(i)
	}
	if err := tbl.Add(ctx, names...); err != nil {
		t.Fatal(err)
	}
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = tbl.SetEgress(ctx, names[i], policies[i])
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("SetEgress %s: %v", names[i], errs[i])
		}
		st, err := tbl.EgressOf(ctx, names[i])
		if want := policies[i].Fingerprint(tbl.EgressDefaults()); err != nil || st.Fingerprint != want {
			t.Errorf("%s: fingerprint %q, %v; want %q", names[i], st.Fingerprint, err, want)
		}
		listing := listChain(t, tbl, EgressChain(names[i]))
		for j := range n {
			own := policies[j].Allow[0].String()
			if has := strings.Contains(listing, own); has != (i == j) {
				t.Errorf("chain of %s lists %s (slot %d's): %v, want %v:\n%s", names[i], own, j+1, has, i == j, listing)
			}
		}
	}
}

// A change the kernel refuses fails its own caller only: the shared
// transaction it was in is committed again change by change.
func TestRefusedChangeFailsOnlyItsCaller(t *testing.T) {
	tbl := privateTable(t)
	ctx := context.Background()
	names := []string{"nftt-h1", "nftt-h2", "nftt-h3"}
	if err := tbl.Add(ctx, names...); err != nil {
		t.Fatal(err)
	}
	// A first change holds the group busy until the others wait behind
	// it, so that they make one batch.
	release := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- tbl.changes.do(tbl, "the first", func(c *nftables.Conn, _ *setIDs) error {
			<-release
			return nil
		})
	}()
	waitFor(t, "the first change to hold the group", func() bool { return tbl.changes.queued() == 0 && tbl.changes.isBusy() })
	refused := make(chan error, 1)
	go func() {
		// A rule in a chain that does not exist: ENOENT at the commit.
		refused <- tbl.changes.do(tbl, "chain nope", func(c *nftables.Conn, _ *setIDs) error {
			c.AddRule(&nftables.Rule{Table: tbl.table(), Chain: &nftables.Chain{Name: "nope", Table: tbl.table()},
				Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
			return nil
		})
	}()
	waitFor(t, "the refused change to queue", func() bool { return tbl.changes.queued() == 1 })
	ok := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() { ok[i] = tbl.SetEgress(ctx, name, policyOf(i)) })
	}
	waitFor(t, "the batch to gather", func() bool { return tbl.changes.queued() == 1+len(names) })
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first change: %v", err)
	}
	if err := <-refused; !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "chain nope") {
		t.Errorf("refused change: %v, want ENOENT naming it", err)
	}
	wg.Wait()
	for i, name := range names {
		if ok[i] != nil {
			t.Errorf("SetEgress %s beside a refused change: %v", name, ok[i])
		}
		st, err := tbl.EgressOf(ctx, name)
		if want := policyOf(i).Fingerprint(tbl.EgressDefaults()); err != nil || st.Fingerprint != want {
			t.Errorf("%s: fingerprint %q, %v; want %q", name, st.Fingerprint, err, want)
		}
	}
	if tbl.changes.isBusy() {
		t.Error("the group is still busy with nobody waiting")
	}
}

// policyOf is slot i's policy: a long allow list (an anonymous set) whose
// first range is slot i's own (ranges apart, so that none merge), and a
// short deny list (rules).
func policyOf(i int) egress.Policy {
	var p egress.Policy
	for k := range inlineMax + 2 {
		p.Allow = append(p.Allow, netip.PrefixFrom(netip.AddrFrom4([4]byte{23, byte(i), byte(2 * k), 0}), 24))
	}
	p.Deny = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{34, byte(i), 0, 0}), 16)}
	return p
}

// listChain is nft's listing of a chain of tbl, its sets' elements
// printed in the rules.
func listChain(tb testing.TB, tbl *Table, chain string) string {
	tb.Helper()
	out, err := exec.Command("nsenter", "--net="+tbl.netns, "nft", "list", "chain", "inet", tbl.name, chain).CombinedOutput()
	if err != nil {
		tb.Fatalf("nft list chain %s: %v\n%s", chain, err, out)
	}
	return string(out)
}

func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	tb.Fatalf("timed out waiting for %s", what)
}

// queued is how many changes wait for the next commit.
func (g *group) queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

// isBusy reports whether a batch is being committed.
func (g *group) isBusy() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.busy
}
