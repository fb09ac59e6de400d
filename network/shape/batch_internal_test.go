package shape

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
)

// testIfbs makes ifbs named prefix0..prefix(n-1) in the host's namespace,
// removed when the test ends whatever happens to them.
func testIfbs(t *testing.T, prefix string, n int) []string {
	t.Helper()
	var names []string
	for i := range n {
		name := fmt.Sprintf("%s%d", prefix, i)
		if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			t.Fatalf("add ifb %s: %v", name, err)
		}
		t.Cleanup(func() {
			if l, err := netlink.LinkByName(name); err == nil {
				_ = netlink.LinkDel(l)
			}
		})
		names = append(names, name)
	}
	return names
}

// there reports whether a link named name exists.
func there(name string) bool {
	_, err := netlink.LinkByName(name)
	return err == nil
}

// TestDeleteIfbs deletes a batch's ifbs in one deletion: each of them
// goes, a missing name is fine, a link of the name that is no ifb stays,
// and a group found to hold another link is not deleted (each ifb then
// goes alone).
func TestDeleteIfbs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	prefix := fmt.Sprintf("ptb%03d", rand.IntN(1000))
	ifbs := testIfbs(t, prefix+"i", 5)
	veth := prefix + "v"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: veth}, PeerName: prefix + "w"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(veth); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	if failed := DeleteIfbs(append(ifbs, prefix+"missing", veth)); len(failed) != 0 {
		t.Fatalf("failed: %v", failed)
	}
	for _, name := range ifbs {
		if there(name) {
			t.Errorf("%s is there after DeleteIfbs", name)
		}
	}
	if !there(veth) {
		t.Errorf("the veth %s, named among the ifbs, was deleted", veth)
	}

	// Another link in the group: deleteGroup refuses, and DeleteIfbs
	// deletes each of its ifbs alone.
	ours := testIfbs(t, prefix+"o", 2)
	foreign := testIfbs(t, prefix+"f", 1)[0]
	const group = 1<<24 + 7
	var links []netlink.Link
	for _, name := range append(ours, foreign) {
		l, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetGroup(l, group); err != nil {
			t.Fatal(err)
		}
		links = append(links, l)
	}
	if err := deleteGroup(group, links[:2]); err == nil {
		t.Fatal("deleteGroup deleted a group holding another link")
	}
	for _, name := range append(ours, foreign) {
		if !there(name) {
			t.Errorf("%s was deleted with a group deleteGroup refused", name)
		}
	}
	failed := map[string]error{}
	deleteEach(links[:2], failed)
	if len(failed) != 0 || there(ours[0]) || there(ours[1]) || !there(foreign) {
		t.Errorf("deleteEach: failed %v; ours there: %v %v; the other there: %v", failed, there(ours[0]), there(ours[1]), there(foreign))
	}
	if err := DeleteIfb(prefix + "missing"); err != nil {
		t.Errorf("DeleteIfb of a missing name: %v", err)
	}
}
