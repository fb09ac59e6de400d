package nft_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/nft"
)

// nftSet reads a set's elements through the nft command, as an operator
// or a tool that reads the ruleset sees them (`nft -j`: the same
// decoding as the text listing, in a form a test can compare).
func nftSet(t *testing.T, table, set string) (typ string, elems []string) {
	t.Helper()
	out, err := exec.Command("nft", "-j", "list", "set", "inet", table, set).CombinedOutput()
	if err != nil {
		t.Fatalf("nft -j list set inet %s %s: %v\n%s", table, set, err, out)
	}
	var doc struct {
		Nftables []struct {
			Set *struct {
				Type string `json:"type"`
				Elem []any  `json:"elem"`
			} `json:"set"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("nft -j output: %v\n%s", err, out)
	}
	for _, o := range doc.Nftables {
		if o.Set == nil {
			continue
		}
		for _, e := range o.Set.Elem {
			elems = append(elems, fmt.Sprint(e))
		}
		slices.Sort(elems)
		return o.Set.Type, elems
	}
	t.Fatalf("nft -j list set inet %s %s: no set in\n%s", table, set, out)
	return "", nil
}

// nftTable is `nft list table inet <table>`, the text an operator reads.
func nftTable(t *testing.T, table string) string {
	t.Helper()
	out, err := exec.Command("nft", "list", "table", "inet", table).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table inet %s: %v\n%s", table, err, out)
	}
	return string(out)
}

func TestListingNamesEveryElement(t *testing.T) {
	env := nettest.New(t, 4) // its cleanup deletes the table
	ctx := context.Background()
	tbl, err := nft.New(env.Config.TableName(), nft.WithSlotNetwork(env.Config.CIDR), nft.WithIsolation(nft.Isolation{HostTCPPorts: []uint16{53, 8080}, HostUDPPorts: []uint16{53}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := tbl.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	names := []string{env.Config.HostIfName(1), env.Config.HostIfName(2), env.Config.HostIfName(3)}
	if err := tbl.Add(ctx, names...); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		set      string
		wantType string
		want     []string
	}{
		{nft.SetName, "ifname", names},
		{nft.SetHostTCP, "inet_service", []string{"53", "8080"}},
		{nft.SetHostUDP, "inet_service", []string{"53"}},
	} {
		typ, got := nftSet(t, tbl.Name(), tc.set)
		want := slices.Sorted(slices.Values(tc.want))
		if typ != tc.wantType || !slices.Equal(got, want) {
			t.Errorf("nft lists set %s as type %q with %q; want type %q with %q", tc.set, typ, got, tc.wantType, want)
		}
	}
	text := nftTable(t, tbl.Name())
	for _, n := range names {
		if !strings.Contains(text, `"`+n+`"`) {
			t.Errorf("nft list table does not name %s:\n%s", n, text)
		}
	}
	if strings.Contains(text, `""`) {
		t.Errorf("nft list table shows an empty name:\n%s", text)
	}
}

// TestEnsureMakesAnOldSetReadable: a table made by an earlier version has
// a slots set without the key's byte order (listed as "" by nft) and rules
// that refer to it. Ensure makes the set again in one transaction, with
// its elements, and the rules refer to the new one.
func TestEnsureMakesAnOldSetReadable(t *testing.T) {
	env := nettest.New(t, 4)
	ctx := context.Background()
	name := env.Config.TableName()
	names := []string{env.Config.HostIfName(1), env.Config.HostIfName(4)}

	// The table as the earlier version made it: the set untyped for nft,
	// its elements, and a rule using it.
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	old := c.AddTable(&nftables.Table{Name: name, Family: nftables.TableFamilyINet})
	set := &nftables.Set{Table: old, Name: nft.SetName, ID: 1, KeyType: nftables.TypeIFName}
	var els []nftables.SetElement
	for _, n := range names {
		k := make([]byte, 16)
		copy(k, n)
		els = append(els, nftables.SetElement{Key: k})
	}
	if err := c.AddSet(set, els); err != nil {
		t.Fatal(err)
	}
	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: nft.ChainForward, Table: old, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: old, Chain: fwd, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	if err := c.Flush(); err != nil {
		t.Fatalf("make the old table: %v", err)
	}
	if _, got := nftSet(t, name, nft.SetName); !slices.Equal(got, []string{"", ""}) {
		t.Fatalf("the old set lists as %q; the test no longer reproduces an old table", got)
	}

	tbl, err := nft.New(name, nft.WithSlotNetwork(env.Config.CIDR))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second Ensure finds the set readable and keeps it
		if err := tbl.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		if _, got := nftSet(t, name, nft.SetName); !slices.Equal(got, slices.Sorted(slices.Values(names))) {
			t.Errorf("after Ensure nft lists %q, want %q", got, names)
		}
		if got, err := tbl.List(ctx); err != nil || !slices.Equal(got, slices.Sorted(slices.Values(names))) {
			t.Errorf("List after Ensure = %q, %v; want %q", got, err, names)
		}
		if n, err := tbl.RuleCount(ctx); err != nil || n != nft.FixedRules {
			t.Errorf("RuleCount after Ensure = %d, %v; want %d", n, err, nft.FixedRules)
		}
	}
}
