package slot_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// A slot whose host link was deleted from outside, its namespace intact
// with a process living in it, is made whole again by Relink: the pair
// made into the same namespace, everything Create promises in place, the
// process untouched. Relink refuses a slot whose host link is there, and
// one whose namespace is not the recorded one, touching neither.
func TestRelinkIntoTheIntactNamespace(t *testing.T) {
	env := nettest.New(t, 4)
	m := env.Manager(t)
	ctx := context.Background()
	s, err := m.Create(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Relink(ctx, s); !errors.Is(err, slot.ErrHostLinkThere) {
		t.Fatalf("Relink of an intact slot = %v, want ErrHostLinkThere", err)
	}
	// A process living in the namespace, as a tenant's would.
	proc := exec.Command("nsenter", "--net="+s.NetnsPath, "sleep", "600")
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Process.Kill(); _ = proc.Wait() })
	link, err := netlink.LinkByIndex(s.HostIfIndex)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(link); err != nil {
		t.Fatal(err)
	}
	idx, err := m.Relink(ctx, s)
	if err != nil {
		t.Fatalf("Relink: %v", err)
	}
	if idx == 0 || idx == s.HostIfIndex {
		t.Errorf("Relink gave host link index %d (the deleted one was %d)", idx, s.HostIfIndex)
	}
	if id, err := netns.Stat(s.NetnsPath); err != nil || id != s.NetnsID {
		t.Errorf("the namespace after Relink is %+v (%v), want the same %+v", id, err, s.NetnsID)
	}
	checkSlot(t, m, s)
	if err := proc.Process.Signal(unix.Signal(0)); err != nil {
		t.Errorf("the process in the namespace is gone: %v", err)
	}
	if _, err := m.Identify(2, s.NetnsID, idx); err != nil {
		t.Errorf("Identify with the new host link's index: %v", err)
	}

	// Another namespace at the name: refused, nothing made.
	if err := netlink.LinkDel(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: idx, Name: s.HostIf}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(s.NetnsPath, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Relink(ctx, s); !errors.Is(err, slot.ErrGone) {
		t.Errorf("Relink of a slot whose namespace was unmounted = %v, want ErrGone", err)
	}
	if err := os.Remove(s.NetnsPath); err != nil {
		t.Fatal(err)
	}
	if _, err := netns.Create(ctx, m.Config().NetnsDir, s.NetnsName); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Relink(ctx, s); !errors.Is(err, slot.ErrGone) {
		t.Errorf("Relink of a slot whose namespace was made again = %v, want ErrGone", err)
	}
	if _, err := netlink.LinkByName(s.HostIf); err == nil {
		t.Errorf("a refused Relink made %s", s.HostIf)
	}
}
