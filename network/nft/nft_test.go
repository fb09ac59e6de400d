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

// TestStampSets: the names a table with a stamp adds are in its stamp
// set, thousands in one transaction, beside the slots set's; another
// stamp's table handle adds to its own; Stamps names the names of the
// other stamps' sets; DropStamps deletes those sets.
func TestStampSets(t *testing.T) {
	env := nettest.New(t, 4)
	ctx := context.Background()
	mine, other := "0123456789abcdef", "fedcba9876543210"
	tbl, err := nft.New(env.Config.TableName(), nft.WithSlotNetwork(env.Config.CIDR), nft.WithStamp(mine))
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
	// Written by another stamp's run first: the table is there, its set
	// is made by Ensure all the same.
	old, err := nft.New(env.Config.TableName(), nft.WithSlotNetwork(env.Config.CIDR), nft.WithStamp(other))
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	extra := env.Config.Prefix + "h9999"
	if err := old.AddNew(ctx, names[0], extra); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Add(ctx, names...); err != nil {
		t.Fatal(err)
	}
	st, err := tbl.Stamps(ctx)
	if err != nil || len(st) != 2 || st[names[0]] != other || st[extra] != other {
		t.Fatalf("Stamps = %v (%v), want %s and %s of %s", st, err, names[0], extra, other)
	}
	if st, err := old.Stamps(ctx); err != nil || len(st) != 3000 || st[names[2999]] != mine {
		t.Fatalf("the other handle's Stamps: %d names (%v), %s: %q", len(st), err, names[2999], st[names[2999]])
	}
	got, err := tbl.List(ctx)
	if err != nil || len(got) != 3001 {
		t.Fatalf("List = %d elements, %v", len(got), err)
	}
	out, err := exec.Command("nft", "list", "set", "inet", env.Config.TableName(), "stamp_"+other).CombinedOutput()
	if err != nil || !strings.Contains(string(out), extra) {
		t.Fatalf("nft list set stamp_%s: %v\n%.2000s", other, err, out)
	}
	if err := tbl.DropStamps(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := tbl.Stamps(ctx); err != nil || len(st) != 0 {
		t.Fatalf("Stamps after DropStamps = %v (%v)", st, err)
	}
	if st, err := old.Stamps(ctx); err != nil || len(st) != 3000 {
		t.Fatalf("the own stamp set after another's DropStamps: %d names (%v)", len(st), err)
	}
	if _, err := nft.New("x", nft.WithStamp("not-a-stamp")); err == nil {
		t.Fatal("a stamp with a dash accepted")
	}
}
