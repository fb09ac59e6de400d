package test

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/nft"
)

// TestRulesetNamesEverySlot: `nft list ruleset`, as an operator reads it,
// names the host link of every slot that exists in the daemon's slots set,
// and nothing else.
func TestRulesetNamesEverySlot(t *testing.T) {
	h := newHost(t)
	d := start(t, nil, h.args(freePort(t), "--slots=64")...)
	d.waitServing(time.Minute)
	// A slot's element is added after its link: poll until the listing
	// and the links agree, and say how they differ if they never do.
	var listed, links []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		listed, links = rulesetSlots(t, h), h.links(h.prefix)
		slices.Sort(links)
		if len(links) == 4 && slices.Equal(listed, links) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nft list ruleset names %q in the slots set; the slots' host links are %q", listed, links)
		}
	}
}

// rulesetSlots returns the names nft list ruleset shows in the slots set
// of h's table, sorted.
func rulesetSlots(t *testing.T, h *host) []string {
	t.Helper()
	ruleset := run(t, "nft", "list", "ruleset")
	_, table, ok := strings.Cut(ruleset, "table inet "+nft.TableName(h.prefix)+" {")
	if !ok {
		t.Fatalf("no table %s in nft list ruleset:\n%s", nft.TableName(h.prefix), ruleset)
	}
	_, set, ok := strings.Cut(table, "set "+nft.SetName+" {")
	if !ok {
		t.Fatalf("no set %s in the table:\n%s", nft.SetName, table)
	}
	set, _, _ = strings.Cut(set, "}")
	var listed []string
	for _, m := range regexp.MustCompile(`"([^"]*)"`).FindAllStringSubmatch(set, -1) {
		listed = append(listed, m[1])
	}
	slices.Sort(listed)
	return listed
}
