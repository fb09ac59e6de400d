package netns_test

import (
	"slices"
	"testing"

	"github.com/phasegate/phasegate/network/netns"
)

// Liveness sees a process that lives in a namespace, and no longer once
// it has left; an empty namespace has no one.
func TestLivenessSeesWhoLivesInANamespace(t *testing.T) {
	dir, prefix := setup(t)
	lived, err := netns.Create(t.Context(), dir, prefix+"1")
	if err != nil {
		t.Fatal(err)
	}
	empty, err := netns.Create(t.Context(), dir, prefix+"2")
	if err != nil {
		t.Fatal(err)
	}
	id, err := netns.Stat(lived)
	if err != nil {
		t.Fatal(err)
	}
	emptyID, err := netns.Stat(empty)
	if err != nil {
		t.Fatal(err)
	}
	pid, leave := startLeaver(t, lived)
	live, err := netns.ScanLiveness()
	if err != nil {
		t.Fatal(err)
	}
	if !live.LivesIn(id) || !slices.Contains(live.PIDs(id), pid) {
		t.Errorf("pid %d inside: LivesIn %t, PIDs %v", pid, live.LivesIn(id), live.PIDs(id))
	}
	if live.LivesIn(emptyID) || live.LivesIn(netns.ID{}) {
		t.Errorf("an empty namespace, or the zero ID, has someone: %v", live.PIDs(emptyID))
	}
	leave()
	if live, err = netns.ScanLiveness(); err != nil || live.LivesIn(id) {
		t.Errorf("after pid %d left: LivesIn %t, %v (PIDs %v)", pid, live.LivesIn(id), err, live.PIDs(id))
	}
}
