package slot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrIfNameTaken is wrapped by [Manager.Attach] when the namespace has a
// link of the name asked for already.
var ErrIfNameTaken = errors.New("interface name taken")

// ErrNotAttachable is wrapped by [Manager.Attach] when it refuses the
// slot or the namespace before touching either: a guest-profile slot, the
// host's namespace or the slot's own.
var ErrNotAttachable = errors.New("not attachable")

// Attachment is where an attached slot's inside end lives: in a network
// namespace the slot does not own (a container's), under another name.
type Attachment struct {
	// IfName and IfIndex name the inside end in that namespace.
	IfName  string
	IfIndex int
	// MAC is the inside end's hardware address, HostMAC the host end's.
	MAC, HostMAC net.HardwareAddr
}

// Attach gives slot s an inside end in the network namespace open at nsFD
// (see [netns.OpenForeign]), named ifname there, with the slot's inside
// address and a default route via the slot's host address. A default
// route the namespace has is replaced: the container's traffic leaves
// through the slot.
//
// The pair is made there, its inside end created in that namespace: a
// link moved between namespaces waits for the kernel's pending RCU
// callbacks while it holds the networking lock (rcu_barrier in
// dev_change_net_namespace), which every other attach then queues behind,
// where a pair made in place waits for nothing (DESIGN.md §11). The
// slot's warm pair is parked first: its host end set down, renamed to
// [Config.ParkedIfName] and stripped of the slot's host address, so that
// the new host end takes the slot's name, and with it the slot's firewall
// element and egress policy, which are keyed by name. The parked pair's
// inside end stays in the slot's own namespace and goes with it when the
// slot is torn down. s.HostIfIndex becomes the new host end's: the caller
// records it.
//
// A name the namespace has already is refused with [ErrIfNameTaken], the
// host's own namespace and the slot's with [ErrNotAttachable] (which
// other namespaces a slot may join is the caller's to decide:
// [Manager.SlotsIn] names the slots whose ends a namespace holds); then,
// as when parking fails, the slot is as it was. A failure after the warm
// pair is parked deletes what was made, leaves nothing in the namespace,
// and leaves the slot for the caller to tear down.
//
// The namespace is the caller's (its runtime made it and destroys it);
// Attach never closes nsFD. A guest-profile slot, whose inside is a
// microVM's tap, cannot be attached.
func (m *Manager) Attach(ctx context.Context, s *Slot, nsFD int, ifname string) (*Attachment, error) {
	if err := CheckIfName(ifname); err != nil {
		return nil, fmt.Errorf("slot %d: attach: %w", s.Index, err)
	}
	if m.cfg.Guest.Enabled() {
		return nil, fmt.Errorf("slot %d: attach: %w: a guest-profile slot's inside is a microVM's tap", s.Index, ErrNotAttachable)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("slot %d: attach: %w", s.Index, err)
	}
	if err := notOurs(s, nsFD); err != nil {
		return nil, fmt.Errorf("slot %d: attach: %w: %w", s.Index, ErrNotAttachable, err)
	}
	to, err := netlink.NewHandleAt(vns.NsHandle(nsFD))
	if err != nil {
		return nil, fmt.Errorf("slot %d: attach: netlink handle in the target namespace: %w", s.Index, err)
	}
	defer to.Close()
	// The name first: a namespace that has it is refused before anything
	// is touched, so that there is nothing to undo.
	if err := nameFree(to, ifname); err != nil {
		return nil, fmt.Errorf("slot %d: attach as %s: %w", s.Index, ifname, err)
	}
	warm, err := netlink.LinkByIndex(s.HostIfIndex)
	if err != nil || warm.Attrs().Name != s.HostIf {
		return nil, fmt.Errorf("slot %d: attach: host end %s (index %d) is gone: %v", s.Index, s.HostIf, s.HostIfIndex, err)
	}
	if err := m.park(s, warm); err != nil {
		return nil, fmt.Errorf("slot %d: attach: %w", s.Index, err)
	}
	a, err := m.pairInto(s, nsFD, to, ifname)
	if err != nil {
		return nil, fmt.Errorf("slot %d: attach as %s: %w", s.Index, ifname, err)
	}
	return a, nil
}

// park sets the warm host end down, renames it to the slot's parked name
// and takes the slot's host address off it, so that a new host end can
// take both. A step that fails undoes those before it.
func (m *Manager) park(s *Slot, warm netlink.Link) (err error) {
	parked := m.cfg.ParkedIfName(s.Index)
	if err := clearParked(parked); err != nil {
		return err
	}
	// The address goes before the link goes down: a link that goes down
	// with routes through it makes the kernel walk every route of the
	// host's tables (fib_flush), one per slot on a host of slots (figures:
	// docs/BENCHMARKS.md).
	addr := &netlink.Addr{IPNet: ipNet(s.HostAddr)}
	if err := netlink.AddrDel(warm, addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("take %s off %s: %w", s.HostAddr, s.HostIf, err)
	}
	defer func() {
		if err != nil {
			if aerr := netlink.AddrAdd(warm, addr); aerr != nil && !errors.Is(aerr, unix.EEXIST) {
				err = errors.Join(err, fmt.Errorf("put %s back on %s: %w", s.HostAddr, s.HostIf, aerr))
			}
		}
	}()
	if err := dropHostAddr6(warm, s); err != nil {
		return err
	}
	defer func() {
		if err != nil && s.HostAddr6.IsValid() {
			a6 := &netlink.Addr{IPNet: ipNet(s.HostAddr6), Flags: unix.IFA_F_NODAD}
			if aerr := netlink.AddrAdd(warm, a6); aerr != nil && !errors.Is(aerr, unix.EEXIST) {
				err = errors.Join(err, fmt.Errorf("put %s back on %s: %w", s.HostAddr6, s.HostIf, aerr))
			}
		}
	}()
	// A link is renamed only while down.
	if err := netlink.LinkSetDown(warm); err != nil {
		return fmt.Errorf("set %s down: %w", s.HostIf, err)
	}
	if err := netlink.LinkSetName(warm, parked); err != nil {
		if uerr := netlink.LinkSetUp(warm); uerr != nil {
			err = errors.Join(err, fmt.Errorf("set %s up again: %w", s.HostIf, uerr))
		}
		return fmt.Errorf("rename %s to %s: %w", s.HostIf, parked, err)
	}
	return nil
}

// clearParked deletes the parked end of an earlier slot at the same index,
// still on the host: the teardown that unlinked its namespace does not wait
// for the kernel to remove it (nothing else waits on a parked end), so an
// index soon used again may find it. The name is unique to the prefix and
// the index; a link of that name that is no veth is not a parked end, and
// refused.
func clearParked(name string) error {
	p, err := newLinkProbe()
	if err != nil {
		return err
	}
	defer p.close()
	idx, err := p.indexNoLoad(name)
	if err != nil || idx == 0 {
		return err
	}
	l, err := netlink.LinkByIndex(idx)
	if err != nil {
		return nil // gone meanwhile
	}
	if _, ok := l.(*netlink.Veth); !ok {
		return fmt.Errorf("the host has a link named %s, which is no parked end (a %s)", name, l.Type())
	}
	return deleteLink(p, idx, name)
}

// pairInto makes the slot's new pair: its host end under the slot's name,
// its inside end as ifname in the namespace open at nsFD (handle to), and
// configures both. On failure the new pair is deleted (its host end takes
// the inside end with it).
func (m *Manager) pairInto(s *Slot, nsFD int, to *netlink.Handle, ifname string) (a *Attachment, err error) {
	// One queue each way, as Create's pair (see there).
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: s.HostIf, NumTxQueues: 1, NumRxQueues: 1},
		PeerName:      ifname,
		PeerNamespace: netlink.NsFd(nsFD),
	}
	// Not ErrIfNameTaken, should the name have come meanwhile: the warm
	// pair is parked, so this is no refusal that left the slot as it was.
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("add veth %s<->%s: %w", s.HostIf, ifname, err)
	}
	p, err := newLinkProbe()
	if err != nil {
		return nil, errors.Join(err, netlink.LinkDel(veth))
	}
	defer p.close()
	idx, err := p.index(s.HostIf)
	if err != nil || idx == 0 {
		return nil, errors.Join(fmt.Errorf("find the new %s: index %d: %v", s.HostIf, idx, err), netlink.LinkDel(veth))
	}
	defer func() {
		if err != nil {
			if derr := deleteLink(p, idx, s.HostIf); derr != nil {
				err = errors.Join(err, fmt.Errorf("delete the new pair: %w", derr))
			}
		}
	}()
	host, err := netlink.LinkByIndex(idx)
	if err != nil {
		return nil, fmt.Errorf("find the new %s: %w", s.HostIf, err)
	}
	if err := m.addressHostEnd(host, s); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return nil, fmt.Errorf("set %s up: %w", s.HostIf, err)
	}
	in, err := to.LinkByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("find %s in the namespace: %w", ifname, err)
	}
	if err := to.AddrReplace(in, &netlink.Addr{IPNet: ipNet(s.InsideAddr)}); err != nil {
		return nil, fmt.Errorf("address %s on %s: %w", s.InsideAddr, ifname, err)
	}
	if err := to.LinkSetUp(in); err != nil {
		return nil, fmt.Errorf("set %s up: %w", ifname, err)
	}
	def := &netlink.Route{LinkIndex: in.Attrs().Index, Gw: s.HostAddr.Addr().AsSlice()}
	if err := to.RouteReplace(def); err != nil {
		return nil, fmt.Errorf("default route via %s on %s: %w", s.HostAddr.Addr(), ifname, err)
	}
	if err := attach6(to, in, s); err != nil {
		return nil, err
	}
	s.HostIfIndex = idx
	return &Attachment{IfName: ifname, IfIndex: in.Attrs().Index, MAC: in.Attrs().HardwareAddr, HostMAC: host.Attrs().HardwareAddr}, nil
}

// nameFree refuses a namespace (handle h) that has a link named ifname.
func nameFree(h *netlink.Handle, ifname string) error {
	switch _, err := h.LinkByName(ifname); {
	case err == nil:
		return fmt.Errorf("the namespace has a link named %s: %w", ifname, ErrIfNameTaken)
	case !isNotFound(err):
		return fmt.Errorf("look for %s in the namespace: %w", ifname, err)
	}
	return nil
}

// notOurs refuses a target namespace that is the host's own (whose
// default route Attach would replace) or the slot's.
func notOurs(s *Slot, nsFD int) error {
	var target, root unix.Stat_t
	if err := unix.Fstat(nsFD, &target); err != nil {
		return fmt.Errorf("fstat the target namespace: %w", err)
	}
	// No goroutine that runs Go code changes namespace: this thread's is
	// the host's.
	if err := unix.Stat("/proc/thread-self/ns/net", &root); err != nil {
		return fmt.Errorf("stat the host's namespace: %w", err)
	}
	switch id := (netns.ID{Dev: target.Dev, Ino: target.Ino}); {
	case target.Dev == root.Dev && target.Ino == root.Ino:
		return errors.New("the target is the host's own namespace")
	case id == s.NetnsID:
		return errors.New("the target is the slot's own namespace")
	}
	return nil
}

// Detach ends an attachment of slot s: it deletes the slot's host end,
// which takes the inside end with it wherever it lives, never the
// namespace it lives in (the runtime's). The slot's own namespace is left
// for the teardown, which then has no link to wait for (a teardown waits
// for the kernel to remove a pair with the slot's namespace, which an
// attached pair, whose inside end lives elsewhere, never is). A host end
// already gone (the container's namespace went, and the pair with it) is
// not an error; a link of that name with another index is not the slot's
// and is left alone.
func (m *Manager) Detach(ctx context.Context, s *Slot) error {
	p, err := probeFor(ctx, s, "detach")
	if err != nil {
		return err
	}
	defer p.close()
	if err := deleteLink(p, s.HostIfIndex, s.HostIf); err != nil {
		return fmt.Errorf("slot %d: detach: %w", s.Index, err)
	}
	return nil
}

// Unplug cuts slot s's attachment off at once and leaves the deletion of
// its pair to the slot's teardown: deleting a link waits for the kernel's
// pending RCU callbacks, which a runtime's DEL need not wait for, and
// concurrent deletions in the teardown's workers share. The host end is
// set down; the container's end, in the namespace open at nsFD (-1 when
// it is gone), is set down and renamed to the slot's parked name there,
// so that ifname is free for the runtime at once. A link named ifname
// there that is not the host end's peer is the container's own, and left
// alone; a host end already gone is not an error. The teardown knows the
// slot attached by its parked end, and cuts the host end off rather than
// wait for the kernel to remove it with the slot's namespace, which it
// never would (the pair's inside end is elsewhere).
func (m *Manager) Unplug(ctx context.Context, s *Slot, nsFD int, ifname string) error {
	p, err := probeFor(ctx, s, "unplug")
	if err != nil {
		return err
	}
	defer p.close()
	switch ok, err := p.exists(s.HostIfIndex, s.HostIf); {
	case err != nil:
		return fmt.Errorf("slot %d: unplug: %w", s.Index, err)
	case !ok:
		return nil // gone, the container's end with it
	}
	host := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: s.HostIfIndex, Name: s.HostIf}}
	// The address first, as in park: the link then goes down with no
	// route through it, and the kernel walks no table.
	if err := netlink.AddrDel(host, &netlink.Addr{IPNet: ipNet(s.HostAddr)}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("slot %d: unplug: take %s off %s: %w", s.Index, s.HostAddr, s.HostIf, err)
	}
	if err := dropHostAddr6(host, s); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("slot %d: unplug: %w", s.Index, err)
	}
	if err := netlink.LinkSetDown(host); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("slot %d: unplug: set %s down: %w", s.Index, s.HostIf, err)
	}
	if nsFD < 0 {
		return nil
	}
	h, err := netlink.NewHandleAt(vns.NsHandle(nsFD))
	if err != nil {
		return fmt.Errorf("slot %d: unplug: netlink handle in the container's namespace: %w", s.Index, err)
	}
	defer h.Close()
	in, err := h.LinkByName(ifname)
	switch {
	case isNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("slot %d: unplug: find %s in the container's namespace: %w", s.Index, ifname, err)
	}
	if _, ok := in.(*netlink.Veth); !ok || in.Attrs().ParentIndex != s.HostIfIndex {
		return nil
	}
	if err := h.LinkSetDown(in); err != nil {
		return fmt.Errorf("slot %d: unplug: set %s down in the container's namespace: %w", s.Index, ifname, err)
	}
	if err := h.LinkSetName(in, m.cfg.ParkedIfName(s.Index)); err != nil {
		return fmt.Errorf("slot %d: unplug: rename %s in the container's namespace: %w", s.Index, ifname, err)
	}
	return nil
}

// CheckIfName refuses a name the kernel would not take for a link: the
// kernel's rule, which internal/names holds (names.CheckKernelIfName).
func CheckIfName(name string) error {
	return names.CheckKernelIfName("interface name", name)
}

// isNotFound reports whether err says that no link has the name asked.
func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// probeFor opens a link probe for op on slot s, unless ctx is done; its
// errors name the slot and op.
func probeFor(ctx context.Context, s *Slot, op string) (*linkProbe, error) {
	err := ctx.Err()
	var p *linkProbe
	if err == nil {
		p, err = newLinkProbe()
	}
	if err != nil {
		return nil, fmt.Errorf("slot %d: %s: %w", s.Index, op, err)
	}
	return p, nil
}

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
	for _, want := range [][2]netip.Prefix{{s.InsideAddr, s.HostAddr}, {s.InsideAddr6, s.HostAddr6}} {
		if !want[0].IsValid() {
			continue // a slot without IPv6
		}
		if err := hasAddr(to, in, want[0].String()); err != nil {
			return fail("%s: %v", ifname, err)
		}
		if err := hasDefaultRoute(to, in, want[1].Addr().String()); err != nil {
			return fail("%s: %v", ifname, err)
		}
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
	addrs, err := retried(func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_ALL) })
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
	routes, err := retried(func() ([]netlink.Route, error) { return h.RouteList(l, netlink.FAMILY_ALL) })
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

// isDefaultMask reports whether dst is 0.0.0.0/0 (or ::/0).
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
