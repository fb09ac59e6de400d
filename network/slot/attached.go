package slot

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrNotAttached is wrapped by [Manager.Attached] when the attachment is
// not as [Manager.Attach] left it; the error says what differs.
var ErrNotAttached = errors.New("attachment not as made")

// Attached returns slot s's attachment as ifname in the network namespace
// open at nsFD, after checking that it is as [Manager.Attach] left it:
// the host end there and up, its peer in that namespace under ifname, up,
// with the slot's inside address and a default route via the host end.
// The host end's address is the daemon's to keep ([Manager.RepairHost]),
// and not read here: the host's address dump grows with the slots. What differs fails with an error wrapping [ErrNotAttached]
// that names it; nothing is changed, in either namespace. It answers a
// repeated ADD and a CNI CHECK.
func (m *Manager) Attached(s *Slot, nsFD int, ifname string) (*Attachment, error) {
	fail := func(format string, a ...any) (*Attachment, error) {
		return nil, fmt.Errorf("slot %d as %s: %w: %s", s.Index, ifname, ErrNotAttached, fmt.Sprintf(format, a...))
	}
	host, err := netlink.LinkByIndex(s.HostIfIndex)
	if err != nil || host.Attrs().Name != s.HostIf {
		return fail("host end %s (index %d) is gone", s.HostIf, s.HostIfIndex)
	}
	if host.Attrs().Flags&net.FlagUp == 0 {
		return fail("host end %s is down", s.HostIf)
	}
	to, err := netlink.NewHandleAt(vns.NsHandle(nsFD))
	if err != nil {
		return nil, fmt.Errorf("slot %d: netlink handle in the container's namespace: %w", s.Index, err)
	}
	defer to.Close()
	in, err := to.LinkByName(ifname)
	switch {
	case isNotFound(err):
		return fail("no link %s in the container's namespace", ifname)
	case err != nil:
		return nil, fmt.Errorf("slot %d: find %s in the container's namespace: %w", s.Index, ifname, err)
	}
	if _, ok := in.(*netlink.Veth); !ok || in.Attrs().ParentIndex != s.HostIfIndex {
		return fail("%s in the container's namespace is not the peer of host end %s", ifname, s.HostIf)
	}
	if in.Attrs().Flags&net.FlagUp == 0 {
		return fail("%s is down", ifname)
	}
	if err := hasAddr(to, in, s.InsideAddr.String()); err != nil {
		return fail("%s: %v", ifname, err)
	}
	if err := hasDefaultRoute(to, in, s.HostAddr.Addr().String()); err != nil {
		return fail("%s: %v", ifname, err)
	}
	return &Attachment{IfName: ifname, IfIndex: in.Attrs().Index, MAC: in.Attrs().HardwareAddr, HostMAC: host.Attrs().HardwareAddr}, nil
}

// dumpTries bounds the reads of a container's namespace that a change
// there interrupts (NLM_F_DUMP_INTR): it holds a few entries, and a
// second read is consistent unless something changes it all the time.
const dumpTries = 3

// retried runs dump until it is not interrupted by a change, dumpTries at
// most.
func retried[T any](dump func() (T, error)) (T, error) {
	var v T
	var err error
	for range dumpTries {
		if v, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}

// hasAddr fails unless link l, in the namespace of h, carries addr (a
// prefix: "169.254.0.1/31").
func hasAddr(h *netlink.Handle, l netlink.Link, addr string) error {
	addrs, err := retried(func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if a.IPNet.String() == addr {
			return nil
		}
	}
	return fmt.Errorf("address %s missing (has %d others)", addr, len(addrs))
}

// hasDefaultRoute fails unless the namespace of h routes by default
// through link l via gw.
func hasDefaultRoute(h *netlink.Handle, l netlink.Link, gw string) error {
	routes, err := retried(func() ([]netlink.Route, error) { return h.RouteList(l, netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.IP.IsUnspecified() && isDefaultMask(r.Dst)) && r.Gw.String() == gw {
			return nil
		}
	}
	return fmt.Errorf("no default route via %s", gw)
}

// isDefaultMask reports whether dst is 0.0.0.0/0.
func isDefaultMask(dst *net.IPNet) bool {
	ones, _ := dst.Mask.Size()
	return ones == 0
}

// SlotsIn returns the indices of this manager's slots whose inside end is
// in the network namespace open at nsFD: a veth there whose peer, in the
// host's namespace, is one of the manager's host ends. A slot's own
// namespace holds its slot's end (until it is attached elsewhere); a
// container's holds those of the slots attached to it. A namespace with
// no link whose peer is in the host's has no id for the host
// (NETNSA_NSID_NOT_ASSIGNED, -1) and holds none.
func (m *Manager) SlotsIn(nsFD int) ([]int, error) {
	to, err := netlink.NewHandleAt(vns.NsHandle(nsFD))
	if err != nil {
		return nil, fmt.Errorf("netlink handle in the namespace: %w", err)
	}
	defer to.Close()
	host, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the host's namespace: %w", err)
	}
	defer unix.Close(host)
	hostID, err := to.GetNetNsIdByFd(host)
	if err != nil {
		return nil, fmt.Errorf("the host's namespace id in the namespace: %w", err)
	}
	if hostID < 0 {
		return nil, nil
	}
	links, err := retried(to.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list the namespace's links: %w", err)
	}
	var out []int
	for _, l := range links {
		a := l.Attrs()
		if _, ok := l.(*netlink.Veth); !ok || a.NetNsID != hostID || a.ParentIndex == 0 {
			continue
		}
		peer, err := netlink.LinkByIndex(a.ParentIndex)
		if err != nil {
			continue // gone meanwhile: not a slot's any more
		}
		i, ok := m.cfg.CanonicalHostIfIndex(peer.Attrs().Name)
		if !ok {
			continue
		}
		// An attachment's end that Unplug cut off (down, renamed to the
		// slot's parked name) and the teardown has yet to delete: the
		// namespace is still the container's, which the runtime may
		// attach again at once.
		if a.Name == m.cfg.ParkedIfName(i) && a.Flags&net.FlagUp == 0 {
			continue
		}
		out = append(out, i)
	}
	return out, nil
}
