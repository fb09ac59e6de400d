package nft_test

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/nft"
)

func TestTableName(t *testing.T) {
	for in, want := range map[string]string{"pg-": "phasegate_pg_", "ab_c9": "phasegate_ab_c9", "a.b/c": "phasegate_a_b_c"} {
		if got := nft.TableName(in); got != want {
			t.Errorf("TableName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTable(t *testing.T) {
	env := nettest.New(t, 4) // its cleanup deletes the table too
	ctx := context.Background()
	tbl, err := nft.New(env.Config.TableName(), nft.WithSlotNetwork(env.Config.CIDR))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := tbl.Exists(ctx); err != nil || ok {
		t.Fatalf("Exists before Ensure = %v, %v", ok, err)
	}
	for range 2 {
		if err := tbl.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rules, err := tbl.RuleCount(ctx)
	if err != nil || rules != nft.FixedRules {
		t.Fatalf("RuleCount = %d, %v; want %d", rules, err, nft.FixedRules)
	}
	// Thousands of elements in one transaction.
	var names []string
	for i := 1; i <= 3000; i++ {
		names = append(names, fmt.Sprintf("%sh%d", env.Config.Prefix, i))
	}
	if err := tbl.Add(ctx, names...); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Add(ctx, names[:10]...); err != nil {
		t.Errorf("re-adding present elements: %v", err)
	}
	got, err := tbl.List(ctx)
	if err != nil || len(got) != 3000 {
		t.Fatalf("List = %d elements, %v", len(got), err)
	}
	if n, _ := tbl.RuleCount(ctx); n != rules {
		t.Errorf("rule count grew with elements: %d", n)
	}
	// Remove a mix of present and absent names, then a single absent one.
	rm := append(slices.Clone(names[:2500]), "nothere0", "nothere1")
	if err := tbl.Remove(ctx, rm...); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Remove(ctx, "nothere2"); err != nil {
		t.Errorf("single absent remove: %v", err)
	}
	got, _ = tbl.List(ctx)
	want := slices.Clone(names[2500:])
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("after remove: %d elements", len(got))
	}
	if err := tbl.Add(ctx, "this-name-is-far-too-long"); err == nil {
		t.Errorf("over-long interface name accepted")
	}
	if err := tbl.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Delete(ctx); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	if els, err := tbl.List(ctx); err != nil || len(els) != 0 {
		t.Errorf("List of missing table = %v, %v", els, err)
	}
	if err := tbl.Remove(ctx, "a", "b"); err != nil {
		t.Errorf("Remove on missing table: %v", err)
	}
}

// TestStampedElements: elements carry the table's stamp as their comment,
// thousands in one transaction with the longest stamp, read back from the
// same dump as the names; an element added again keeps its first stamp,
// and nft lists the comment.
func TestStampedElements(t *testing.T) {
	env := nettest.New(t, 4)
	ctx := context.Background()
	long := strings.Repeat("s", 128)
	tbl, err := nft.New(env.Config.TableName(), nft.WithSlotNetwork(env.Config.CIDR), nft.WithStamp(long))
	if err != nil {
		t.Fatal(err)
	}
	if err := tbl.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := 1; i <= 3000; i++ {
		names = append(names, fmt.Sprintf("%sh%d", env.Config.Prefix, i))
	}
	if err := tbl.Add(ctx, names...); err != nil {
		t.Fatal(err)
	}
	other, err := nft.New(env.Config.TableName(), nft.WithSlotNetwork(env.Config.CIDR), nft.WithStamp("store 0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	extra := env.Config.Prefix + "h9999"
	if err := other.Add(ctx, names[0], extra); err != nil {
		t.Fatal(err)
	}
	got, stamps, err := tbl.ListStamped(ctx)
	if err != nil || len(got) != 3001 || len(stamps) != 3001 {
		t.Fatalf("ListStamped = %d names, %d stamps, %v", len(got), len(stamps), err)
	}
	if stamps[names[0]] != long || stamps[names[2999]] != long || stamps[extra] != "store 0123456789abcdef" {
		t.Fatalf("stamps of %s, %s, %s: %.20q %.20q %q", names[0], names[2999], extra, stamps[names[0]], stamps[names[2999]], stamps[extra])
	}
	out, err := exec.Command("nft", "list", "set", "inet", env.Config.TableName(), nft.SetName).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `comment "store 0123456789abcdef"`) {
		t.Fatalf("nft list set: %v\n%.2000s", err, out)
	}
	if _, err := nft.New("x", nft.WithStamp(long+"s")); err == nil {
		t.Fatal("a stamp of 129 bytes accepted")
	}
}
