package slot

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/osthread"
	"github.com/phasegate/phasegate/network/netns"
)

// containerNetns makes a network namespace standing for a container's,
// as a runtime would (bound at a file of its own), opens it as Attach's
// callers do, and removes it at the end: its links, the slot's attached
// end included, go with it.
func containerNetns(t *testing.T) (path string, fd int, h *netlink.Handle) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	path, err := netns.Create(ctx, dir, "ctr")
	if err != nil {
		t.Fatal(err)
	}
	if fd, err = netns.OpenForeign(path); err != nil {
		t.Fatal(err)
	}
	if h, err = netlink.NewHandleAt(vns.NsHandle(fd)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		unix.Close(fd)
		if err := netns.Delete(ctx, dir, "ctr"); err != nil {
			t.Errorf("remove the container's namespace: %v", err)
		}
		for unix.Unmount(dir, unix.MNT_DETACH) == nil {
		}
	})
	return path, fd, h
}

// addLink adds a link named name in the namespace of h: a veth, whose
// peer is name with a "p" after it (the kernel here may lack dummy).
func addLink(t *testing.T, h *netlink.Handle, name string) {
	t.Helper()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		t.Fatalf("add %s: %v", name, err)
	}
}

// checkConfigured fails unless the namespace of h has link name up, with
// addr, and a default route through it via gw.
func checkConfigured(t *testing.T, h *netlink.Handle, name string, addr, gw netip.Prefix) {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("find %s: %v", name, err)
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("%s is down", name)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != addr.String() {
		t.Errorf("%s's addresses: %v %v, want %s", name, addrs, err, addr)
	}
	routes, err := h.RouteList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	def := false
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			def = r.Gw.String() == gw.Addr().String()
		}
	}
	if !def {
		t.Errorf("%s: no default route via %s: %v", name, gw.Addr(), routes)
	}
}

// insideHandle is a netlink handle in slot s's own namespace.
func insideHandle(t *testing.T, s *Slot) *netlink.Handle {
	t.Helper()
	fd, err := netns.Open(s.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// echoIn serves one echo on addr, listening in the namespace at path.
func echoIn(t *testing.T, path string, addr netip.Addr) net.Addr {
	t.Helper()
	var l net.Listener
	var err error
	osthread.Throwaway(func() {
		var fd int
		if fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err == nil {
			l, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		}
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", path, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err == nil {
			_, _ = io.Copy(c, c)
			c.Close()
		}
	}()
	return l.Addr()
}

// Attach makes a pair with its inside end in a container's namespace,
// named as the runtime asks, configured and reachable from the host
// through a new host end of the slot's name; the warm pair is parked,
// its host end down and without the slot's address.
func TestAttachMakesAPairInAContainersNamespace(t *testing.T) {
	m := testManager(t)
	ctx := context.Background()
	s, err := m.Create(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	warm := s.HostIfIndex
	path, fd, h := containerNetns(t)
	a, err := m.Attach(ctx, s, fd, "eth0")
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	checkConfigured(t, h, "eth0", s.InsideAddr, s.HostAddr)
	if a.IfName != "eth0" || a.IfIndex == 0 || len(a.MAC) != 6 || len(a.HostMAC) != 6 {
		t.Errorf("attachment %+v: want eth0 with its index and both MACs", a)
	}
	if idx, err := linkIndex(s.HostIf); err != nil || idx != s.HostIfIndex || idx == warm {
		t.Errorf("host end %s: index %d (%v), slot says %d, the warm one was %d: want a new host end, recorded", s.HostIf, idx, err, s.HostIfIndex, warm)
	}
	parked, err := netlink.LinkByIndex(warm)
	if err != nil || parked.Attrs().Name != m.cfg.ParkedIfName(1) || parked.Attrs().Flags&net.FlagUp != 0 {
		t.Fatalf("the warm host end: %v %v, want it parked as %s and down", parked, err, m.cfg.ParkedIfName(1))
	}
	addrs, err := retried(func() ([]netlink.Addr, error) { return netlink.AddrList(parked, netlink.FAMILY_V4) })
	if err != nil || len(addrs) != 0 {
		t.Errorf("the parked host end keeps addresses %v (%v)", addrs, err)
	}
	addr := echoIn(t, path, s.InsideAddr.Addr())
	c, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
	if err != nil {
		t.Fatalf("dial the container through the slot: %v", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the attached slot: %q %v", buf, err)
	}
	if _, err := m.Identify(s.Index, s.NetnsID, s.HostIfIndex); err != nil {
		t.Errorf("the attached slot no longer identifies as itself: %v", err)
	}
}

// Attached answers what Attach made, and names what differs once the
// container's root changes it: each change fails the check, nothing is
// put back.
func TestAttachedNamesWhatDiffers(t *testing.T) {
	m := testManager(t)
	ctx := context.Background()
	s, err := m.Create(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, fd, h := containerNetns(t)
	made, err := m.Attach(ctx, s, fd, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Attached(s, fd, "eth0")
	if err != nil {
		t.Fatalf("Attached right after Attach: %v", err)
	}
	if got.IfIndex != made.IfIndex || got.MAC.String() != made.MAC.String() || got.HostMAC.String() != made.HostMAC.String() {
		t.Errorf("Attached = %+v, Attach made %+v", got, made)
	}
	if _, err := m.Attached(s, fd, "eth1"); !errors.Is(err, ErrNotAttached) || !strings.Contains(err.Error(), "no link eth1") {
		t.Errorf("Attached as a name never attached: %v", err)
	}
	link, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		change func() error
		want   string
	}{
		{func() error {
			return h.RouteDel(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: s.HostAddr.Addr().AsSlice()})
		}, "no default route"},
		{func() error { return h.AddrDel(link, &netlink.Addr{IPNet: ipNet(s.InsideAddr)}) }, "address " + s.InsideAddr.String() + " missing"},
		{func() error { return h.LinkSetDown(link) }, "eth0 is down"},
	} {
		if err := c.change(); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Attached(s, fd, "eth0"); !errors.Is(err, ErrNotAttached) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Attached: %v, want ErrNotAttached naming %q", err, c.want)
		}
	}
	if err := m.Detach(ctx, s); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Attached(s, fd, "eth0"); !errors.Is(err, ErrNotAttached) || !strings.Contains(err.Error(), "host end") {
		t.Errorf("Attached after Detach: %v, want the host end named", err)
	}
}

// SlotsIn names the slots whose inside ends a namespace holds: a slot's
// own namespace holds its slot's, a container's those attached to it, and
// a namespace of nothing but its own links none.
func TestSlotsInNamesTheSlotsANamespaceHolds(t *testing.T) {
	m := testManager(t)
	ctx := context.Background()
	a, err := m.Create(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	_, fd, h := containerNetns(t)
	addLink(t, h, "eth7")
	in := func(what string, fd int, want ...int) {
		t.Helper()
		got, err := m.SlotsIn(fd)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("SlotsIn(%s) = %v, %v; want %v", what, got, err, want)
		}
	}
	bfd, err := netns.OpenForeign(b.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(bfd)
	in("slot 2's own namespace", bfd, 2)
	in("a container with nothing attached", fd)
	if _, err := m.Attach(ctx, a, fd, "eth0"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Attach(ctx, b, fd, "eth1"); err != nil {
		t.Fatal(err)
	}
	got, err := m.SlotsIn(fd)
	slices.Sort(got)
	if err != nil || !slices.Equal(got, []int{1, 2}) {
		t.Errorf("SlotsIn(a container with both attached) = %v, %v", got, err)
	}
	in("slot 2's own namespace, once attached elsewhere", bfd)
}

// A name the namespace has already is refused, and a park that fails is
// undone: either way the slot is as Create left it. A namespace whose own
// link bears the slot's inside end's name still takes the slot under
// another name.
func TestAttachThatFailsLeavesTheSlotAsItWas(t *testing.T) {
	m := testManager(t)
	ctx := context.Background()
	s, err := m.Create(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, fd, h := containerNetns(t)
	addLink(t, h, s.InsideIf)
	// A host link with the parked name that is no parked end (a bridge):
	// parking itself fails.
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: m.cfg.ParkedIfName(1)}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(m.cfg.ParkedIfName(1)); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	warm := s.HostIfIndex
	asMade := func() {
		t.Helper()
		checkConfigured(t, insideHandle(t, s), s.InsideIf, s.InsideAddr, s.HostAddr)
		if up, err := linkUp(s.HostIf); err != nil || !up || s.HostIfIndex != warm {
			t.Errorf("host end %s (index %d, was %d): up %v, %v", s.HostIf, s.HostIfIndex, warm, up, err)
		}
		if _, err := m.Identify(s.Index, s.NetnsID, warm); err != nil {
			t.Errorf("the slot no longer identifies as made: %v", err)
		}
	}
	for _, c := range []struct {
		ifname string
		want   error // nil: any error
	}{
		{s.InsideIf, ErrIfNameTaken},
		{"eth1", nil},
		{"a/b", nil},
		{"much-too-long-name", nil},
	} {
		_, err := m.Attach(ctx, s, fd, c.ifname)
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("Attach as %q: %v, want an error (%v)", c.ifname, err, c.want)
		}
		asMade()
	}
	// Neither the host's own namespace (its default route would be
	// replaced) nor the slot's.
	for _, path := range []string{"/proc/self/ns/net", s.NetnsPath} {
		own, err := netns.OpenForeign(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Attach(ctx, s, own, "pgown0"); !errors.Is(err, ErrNotAttachable) || !strings.Contains(err.Error(), "namespace") {
			t.Errorf("Attach into %s: %v, want ErrNotAttachable naming whose namespace it is", path, err)
		}
		unix.Close(own)
		asMade()
	}
	if links, err := h.LinkList(); err != nil || len(links) != 3 {
		t.Errorf("the failed attaches left links in the container's namespace: %v %v", links, err)
	}
	blocker, err := netlink.LinkByName(m.cfg.ParkedIfName(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(blocker); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Attach(ctx, s, fd, "eth1"); err != nil {
		t.Fatalf("Attach beside a link named %s: %v", s.InsideIf, err)
	}
	checkConfigured(t, h, "eth1", s.InsideAddr, s.HostAddr)
}

// Detach deletes the host end, which takes the container's end with it and
// leaves the container's namespace; the slot's teardown then has no link
// to wait for. A second Detach finds nothing to do.
func TestDetachEndsTheAttachment(t *testing.T) {
	m, ctx, s, path, _, h := attachedSlot(t)
	for range 2 {
		if err := m.Detach(ctx, s); err != nil {
			t.Fatalf("Detach: %v", err)
		}
	}
	if _, err := h.LinkByName("eth0"); !isNotFound(err) {
		t.Errorf("the container's end is still there: %v", err)
	}
	if !netns.IsMounted(path) {
		t.Errorf("the container's namespace %s is gone: it is the runtime's", path)
	}
	if idx, err := linkIndex(s.HostIf); err != nil || idx != 0 {
		t.Errorf("host end %s: index %d, %v; want it gone", s.HostIf, idx, err)
	}
	if err := m.Destroy(ctx, s.Index); err != nil {
		t.Fatalf("the detached slot's teardown: %v", err)
	}
}

// linkUp reports whether the host's link name is up.
func linkUp(name string) (bool, error) {
	p, err := newLinkProbe()
	if err != nil {
		return false, err
	}
	defer p.close()
	return p.up(name)
}

// An earlier slot's parked end still on the host at the index (its
// namespace's clean-up not done yet) is deleted by the next Attach there.
func TestAttachClearsAStaleParkedEnd(t *testing.T) {
	m := testManager(t)
	ctx := context.Background()
	s, err := m.Create(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	hostNS, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer hostNS.Close()
	stale := m.cfg.ParkedIfName(2)
	addLink(t, hostNS, stale)
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(stale + "p"); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	old, err := linkIndex(stale)
	if err != nil || old == 0 {
		t.Fatalf("the stale end: %d %v", old, err)
	}
	_, fd, h := containerNetns(t)
	if _, err := m.Attach(ctx, s, fd, "eth0"); err != nil {
		t.Fatalf("Attach beside a stale parked end: %v", err)
	}
	checkConfigured(t, h, "eth0", s.InsideAddr, s.HostAddr)
	if idx, err := linkIndex(stale); err != nil || idx == 0 || idx == old {
		t.Errorf("%s: index %d (%v), the stale one was %d: want the slot's own parked end", stale, idx, err, old)
	}
}

// Unplug cuts an attachment off at once: the host end down, the
// container's end down and renamed, so that its name is free; the slot's
// teardown then deletes the pair without waiting for the kernel to remove
// it with the slot's namespace (it never would), and leaves the
// container's namespace. A second Unplug, and one of a slot whose
// container's namespace is gone (-1), find nothing to do.
func TestUnplugCutsOffAndTheTeardownDeletes(t *testing.T) {
	m, ctx, s, path, fd, h := attachedSlot(t)
	for range 2 {
		if err := m.Unplug(ctx, s, fd, "eth0"); err != nil {
			t.Fatalf("Unplug: %v", err)
		}
	}
	if err := m.Unplug(ctx, s, -1, "eth0"); err != nil {
		t.Fatalf("Unplug with no namespace: %v", err)
	}
	if _, err := h.LinkByName("eth0"); !isNotFound(err) {
		t.Errorf("eth0 is still named so in the container: %v", err)
	}
	cut, err := h.LinkByName(m.cfg.ParkedIfName(1))
	if err != nil || cut.Attrs().Flags&net.FlagUp != 0 || cut.Attrs().ParentIndex != s.HostIfIndex {
		t.Fatalf("the container's end after Unplug: %v %v, want it down, renamed %s", cut, err, m.cfg.ParkedIfName(1))
	}
	if up, err := linkUp(s.HostIf); err != nil || up {
		t.Errorf("host end %s up after Unplug (%v)", s.HostIf, err)
	}
	res := m.Teardown(ctx, Assume(1), TeardownOptions{})
	if len(res.Reclaimed) != 1 || len(res.CutOff) != 1 {
		t.Fatalf("teardown of the unplugged slot: %+v", res)
	}
	if _, err := h.LinkByName(m.cfg.ParkedIfName(1)); !isNotFound(err) {
		t.Errorf("the container's end outlived the teardown: %v", err)
	}
	if !netns.IsMounted(path) {
		t.Errorf("the container's namespace %s is gone: it is the runtime's", path)
	}
}

// attachedSlot is slot 1 of a test manager, attached as eth0 to a
// container's namespace (its path, descriptor and a netlink handle in
// it), with a context of a minute; the manager's own teardown would not
// end within it if it waited for the pair.
func attachedSlot(t *testing.T) (m *Manager, ctx context.Context, s *Slot, path string, fd int, h *netlink.Handle) {
	t.Helper()
	m = testManager(t)
	m.hostGone = 10 * time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	s, err := m.Create(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	path, fd, h = containerNetns(t)
	if _, err := m.Attach(ctx, s, fd, "eth0"); err != nil {
		t.Fatal(err)
	}
	return m, ctx, s, path, fd, h
}
