package slot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
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

// Attach moves slot s's inside end into the network namespace open at
// nsFD (see [netns.OpenForeign]), names it ifname there, gives it the
// slot's inside address and a default route via the slot's host address,
// and sets it up: a few netlink calls, nothing made (DESIGN.md §11). The
// slot's own namespace stays, empty, and the host end and its rules are
// untouched. The end is renamed to a name unique to the slot before it
// moves, so that a namespace that already has a link named like the
// slot's inside end takes it; a namespace that has one named ifname is
// refused with [ErrIfNameTaken]. A default route the namespace has is
// replaced: the container's traffic leaves through the slot. The host's
// own namespace and the slot's are refused; which other namespaces a slot
// may join is the caller's to decide ([Manager.SlotsIn] names the slots
// whose ends a namespace holds). On any failure after the move began the
// end is moved back and configured as [Manager.Create] left it: the slot
// is as it was.
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
	// Read before the move: after it, a failure must undo the move.
	host, err := netlink.LinkByIndex(s.HostIfIndex)
	if err != nil {
		return nil, fmt.Errorf("slot %d: attach: find host end %s: %w", s.Index, s.HostIf, err)
	}
	slotFD, err := netns.Open(s.NetnsPath)
	if err != nil {
		return nil, fmt.Errorf("slot %d: attach: %w", s.Index, err)
	}
	defer unix.Close(slotFD)
	mv, err := newMove(s, slotFD, nsFD)
	if err != nil {
		return nil, fmt.Errorf("slot %d: attach: %w", s.Index, err)
	}
	defer mv.close()
	// The name first: a namespace that has it is refused before anything
	// is touched, so that there is nothing to undo.
	if err := mv.nameFree(ifname); err != nil {
		return nil, fmt.Errorf("slot %d: attach as %s: %w", s.Index, ifname, err)
	}
	a, err := mv.attach(ifname)
	if err != nil {
		err = fmt.Errorf("slot %d: attach as %s: %w", s.Index, ifname, err)
		if berr := mv.back(m); berr != nil {
			return nil, errors.Join(err, fmt.Errorf("slot %d: put the inside end back: %w", s.Index, berr))
		}
		return nil, err
	}
	a.HostMAC = host.Attrs().HardwareAddr
	return a, nil
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
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("slot %d: detach: %w", s.Index, err)
	}
	p, err := newLinkProbe()
	if err != nil {
		return fmt.Errorf("slot %d: detach: %w", s.Index, err)
	}
	defer p.close()
	if err := deleteLink(p, s.HostIfIndex, s.HostIf); err != nil {
		return fmt.Errorf("slot %d: detach: %w", s.Index, err)
	}
	return nil
}

// CheckIfName refuses a name the kernel would not take for a link.
func CheckIfName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("interface name %q is not a name", name)
	case len(name) >= unix.IFNAMSIZ:
		return fmt.Errorf("interface name %q is %d bytes, at most %d", name, len(name), unix.IFNAMSIZ-1)
	case strings.ContainsAny(name, "/: \t\n"):
		return fmt.Errorf("interface name %q holds '/', ':' or a space", name)
	}
	return nil
}

// move is the inside end of slot s on its way between the slot's
// namespace and another, with a netlink handle in each.
type move struct {
	s            *Slot
	slotFD, toFD int
	from, to     *netlink.Handle
	transitName  string           // unique to the slot while it moves
	mac          net.HardwareAddr // the inside end's, to find it wherever it is
}

func newMove(s *Slot, slotFD, nsFD int) (*move, error) {
	from, err := netlink.NewHandleAt(vns.NsHandle(slotFD))
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", s.NetnsName, err)
	}
	to, err := netlink.NewHandleAt(vns.NsHandle(nsFD))
	if err != nil {
		from.Close()
		return nil, fmt.Errorf("netlink handle in the target namespace: %w", err)
	}
	return &move{s: s, slotFD: slotFD, toFD: nsFD, from: from, to: to, transitName: fmt.Sprintf("pgmv%d", s.Index)}, nil
}

func (mv *move) close() {
	mv.from.Close()
	mv.to.Close()
}

// nameFree refuses a target namespace that has a link named ifname.
func (mv *move) nameFree(ifname string) error {
	switch _, err := mv.to.LinkByName(ifname); {
	case err == nil:
		return fmt.Errorf("the namespace has a link named %s: %w", ifname, ErrIfNameTaken)
	case !isNotFound(err):
		return fmt.Errorf("look for %s in the namespace: %w", ifname, err)
	}
	return nil
}

// attach moves the inside end into the target namespace as ifname and
// configures it there.
func (mv *move) attach(ifname string) (*Attachment, error) {
	s := mv.s
	in, err := mv.from.LinkByName(s.InsideIf)
	if err != nil {
		return nil, fmt.Errorf("find %s in %s: %w", s.InsideIf, s.NetnsName, err)
	}
	mv.mac = in.Attrs().HardwareAddr
	// A link is renamed only while down; moving it drops its addresses
	// and routes, which are set again on the other side.
	if err := mv.from.LinkSetDown(in); err != nil {
		return nil, fmt.Errorf("set %s down in %s: %w", s.InsideIf, s.NetnsName, err)
	}
	if err := mv.from.LinkSetName(in, mv.transitName); err != nil {
		return nil, fmt.Errorf("rename %s to %s in %s: %w", s.InsideIf, mv.transitName, s.NetnsName, err)
	}
	if err := mv.from.LinkSetNsFd(in, mv.toFD); err != nil {
		return nil, fmt.Errorf("move %s out of %s: %w", mv.transitName, s.NetnsName, err)
	}
	link, err := mv.to.LinkByName(mv.transitName)
	if err != nil {
		return nil, fmt.Errorf("find %s in the namespace: %w", mv.transitName, err)
	}
	if err := mv.to.LinkSetName(link, ifname); err != nil {
		return nil, fmt.Errorf("rename %s to %s: %w", mv.transitName, ifname, err)
	}
	if err := mv.to.AddrReplace(link, &netlink.Addr{IPNet: ipNet(s.InsideAddr)}); err != nil {
		return nil, fmt.Errorf("address %s on %s: %w", s.InsideAddr, ifname, err)
	}
	if err := mv.to.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", ifname, err)
	}
	def := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: s.HostAddr.Addr().AsSlice()}
	if err := mv.to.RouteReplace(def); err != nil {
		return nil, fmt.Errorf("default route via %s on %s: %w", s.HostAddr.Addr(), ifname, err)
	}
	return &Attachment{IfName: ifname, IfIndex: link.Attrs().Index, MAC: link.Attrs().HardwareAddr}, nil
}

// back puts the inside end back into the slot's namespace, under its own
// name, configured as Create left it, from wherever a failed attach left
// it: still in the slot's namespace (under either name), or moved (under
// the transit name or the name asked for).
func (mv *move) back(m *Manager) error {
	s := mv.s
	if _, err := mv.from.LinkByName(s.InsideIf); err != nil {
		link, err := mv.from.LinkByName(mv.transitName)
		if err != nil {
			if link, err = mv.findMoved(); err != nil {
				return err
			}
			if err := mv.to.LinkSetDown(link); err != nil {
				return fmt.Errorf("set %s down: %w", link.Attrs().Name, err)
			}
			if err := mv.to.LinkSetName(link, mv.transitName); err != nil {
				return fmt.Errorf("rename %s to %s: %w", link.Attrs().Name, mv.transitName, err)
			}
			if err := mv.to.LinkSetNsFd(link, mv.slotFD); err != nil {
				return fmt.Errorf("move %s back into %s: %w", mv.transitName, s.NetnsName, err)
			}
			if link, err = mv.from.LinkByName(mv.transitName); err != nil {
				return fmt.Errorf("find %s in %s: %w", mv.transitName, s.NetnsName, err)
			}
		}
		if err := mv.from.LinkSetName(link, s.InsideIf); err != nil {
			return fmt.Errorf("rename %s to %s in %s: %w", mv.transitName, s.InsideIf, s.NetnsName, err)
		}
	}
	return m.configureInside(mv.slotFD, s)
}

// findMoved finds the slot's inside end in the target namespace: the veth
// with its hardware address whose peer has its host end's index. An index
// alone could be another namespace's link's (indices are per namespace).
func (mv *move) findMoved() (netlink.Link, error) {
	if mv.mac == nil {
		return nil, fmt.Errorf("the inside end of %s never left %s", mv.s.HostIf, mv.s.NetnsName)
	}
	links, err := mv.to.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list the namespace's links: %w", err)
	}
	for _, l := range links {
		if _, ok := l.(*netlink.Veth); ok && l.Attrs().ParentIndex == mv.s.HostIfIndex && bytes.Equal(l.Attrs().HardwareAddr, mv.mac) {
			return l, nil
		}
	}
	return nil, fmt.Errorf("the inside end of %s is in neither namespace", mv.s.HostIf)
}

// isNotFound reports whether err says that no link has the name asked.
func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}
