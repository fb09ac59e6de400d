package slot

import (
	"context"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
)

// ErrGone is wrapped by [Manager.Lookup] when a slot's objects are not all
// on the host: its namespace file is missing or holds no namespace, or its
// host link is missing; and by [Manager.Identify] when they are not the
// ones it was given either (made again under the same names).
var ErrGone = errors.New("slot objects gone")

// Lookup describes slot i as it is on the host now, with the identity of
// its objects (the namespace bound at its netns file, its host link's
// index), so that a caller can tell whether they are still the ones it
// recorded: a namespace or link made again under the same name has another
// identity. It only reads: nothing on the host changes. A slot whose
// objects are not all there gives an error wrapping [ErrGone] that says
// which is missing.
func (m *Manager) Lookup(i int) (*Slot, error) {
	s, err := m.boundSlot(i)
	if err != nil {
		return nil, err
	}
	idx, err := linkIndex(s.HostIf)
	if err != nil {
		return nil, fmt.Errorf("slot %d: %w", i, err)
	}
	if idx == 0 {
		return nil, fmt.Errorf("slot %d: host link %s: %w", i, s.HostIf, ErrGone)
	}
	s.HostIfIndex = idx
	return s, nil
}

// boundSlot returns slot i with the identity of the namespace bound at its
// netns file, or an error wrapping [ErrGone] when none is bound there.
func (m *Manager) boundSlot(i int) (*Slot, error) {
	if err := m.checkIndex(i); err != nil {
		return nil, err
	}
	s := m.cfg.Slot(i)
	id, err := netns.Stat(s.NetnsPath)
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, netns.ErrNotNamespace):
		return nil, fmt.Errorf("slot %d: namespace %s: %w", i, s.NetnsPath, ErrGone)
	case err != nil:
		return nil, fmt.Errorf("slot %d: %w", i, err)
	}
	s.NetnsID = id
	return &s, nil
}

// Identify returns slot i, as [Manager.Lookup] does, if its objects on the
// host are the ones with the given identity: the namespace bound at its
// netns file is ns, and its host link still has index hostIfIndex.
// Otherwise the error wraps [ErrGone] and says what is missing or differs.
// It only reads.
//
// It is what a restore calls for every recorded slot. Lookup asks for the
// host link by name over netlink, and the kernel's answer about a veth whose
// peer is in another namespace carries the peer's namespace id, found by a
// walk of the root namespace's id table, which holds an entry per slot: a
// restore of N slots through Lookup is quadratic. Identify asks by the
// recorded index with ioctl(SIOCGIFNAME), one lookup that never loads a
// module, and goes to netlink only to say why a link is not the one recorded.
func (m *Manager) Identify(i int, ns netns.ID, hostIfIndex int) (*Slot, error) {
	s, err := m.boundSlot(i)
	if err != nil {
		return nil, err
	}
	if s.NetnsID != ns {
		return nil, fmt.Errorf("slot %d: the namespace at %s is not the one recorded (made again since): %w", i, s.NetnsPath, ErrGone)
	}
	p, err := newLinkProbe()
	if err != nil {
		return nil, err
	}
	defer p.close()
	ok, err := p.exists(hostIfIndex, s.HostIf)
	if err != nil {
		return nil, fmt.Errorf("slot %d: %w", i, err)
	}
	if !ok {
		idx, err := linkIndex(s.HostIf)
		switch {
		case err != nil:
			return nil, fmt.Errorf("slot %d: %w", i, err)
		case idx == 0:
			return nil, fmt.Errorf("slot %d: host link %s: %w", i, s.HostIf, ErrGone)
		default:
			return nil, fmt.Errorf("slot %d: the host link %s is not the one recorded (index %d, recorded %d): %w",
				i, s.HostIf, idx, hostIfIndex, ErrGone)
		}
	}
	s.HostIfIndex = hostIfIndex
	return s, nil
}

// RepairHost puts back what the host link of slot s needs to carry traffic,
// touching nothing inside its namespace: the link up and its address (a
// dual-stack slot's two). It
// returns what it had to repair (nothing, for a slot found as it was
// left). A workload inside keeps running throughout. The slot's firewall
// element is the caller's: one [nft.Table.Add] for all the slots it
// restores.
func (m *Manager) RepairHost(s *Slot) (repaired []string, err error) {
	// By index with ioctls, not netlink: see Identify.
	p, err := newLinkProbe()
	if err != nil {
		return nil, err
	}
	defer p.close()
	switch ok, err := p.exists(s.HostIfIndex, s.HostIf); {
	case err != nil:
		return nil, fmt.Errorf("slot %d: %w", s.Index, err)
	case !ok:
		return nil, fmt.Errorf("slot %d: link index %d is not %s: %w", s.Index, s.HostIfIndex, s.HostIf, ErrGone)
	}
	up, err := p.up(s.HostIf)
	if err != nil {
		return nil, fmt.Errorf("slot %d: %w", s.Index, err)
	}
	link := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: s.HostIfIndex, Name: s.HostIf}}
	if !up {
		if err := netlink.LinkSetUp(link); err != nil {
			return repaired, fmt.Errorf("slot %d: set %s up: %w", s.Index, s.HostIf, err)
		}
		repaired = append(repaired, "link up")
	}
	// Adding the address is how to find out whether it is there: EEXIST
	// says it is. Listing first would dump every IPv4 address of the
	// host, for each slot restored (quadratic in the slots), and a dump
	// is interrupted whenever addresses change elsewhere, which on a busy
	// host they do.
	switch err := netlink.AddrAdd(link, &netlink.Addr{IPNet: ipNet(s.HostAddr)}); {
	case err == nil:
		repaired = append(repaired, "address "+s.HostAddr.String())
	case !errors.Is(err, unix.EEXIST):
		return repaired, fmt.Errorf("slot %d: address %s on %s: %w", s.Index, s.HostAddr, s.HostIf, err)
	}
	if !s.HostAddr6.IsValid() {
		return repaired, nil
	}
	// EACCES: IPv6 is off on the link, a slot made before the IPv6 range
	// was given; it has none until it is released (docs/DESIGN.md §5,
	// "IPv6"), and is not broken for that.
	switch err := netlink.AddrAdd(link, &netlink.Addr{IPNet: ipNet(s.HostAddr6), Flags: unix.IFA_F_NODAD}); {
	case err == nil:
		repaired = append(repaired, "address "+s.HostAddr6.String())
	case !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.EACCES):
		return repaired, fmt.Errorf("slot %d: address %s on %s: %w", s.Index, s.HostAddr6, s.HostIf, err)
	}
	return repaired, nil
}

// RecreateHost makes slot s's veth pair again, into its namespace, when
// the host end is gone (deleted from outside, which takes the inside end
// with it) and the namespace bound at its netns file is still the one s
// names (s.NetnsID): the host end with its address, IPv6 off, up; the
// inside end with its address, up, and the inside default route; the
// firewall element, stamped. Nothing else inside changes: the processes
// there, their other interfaces and tables stay as they are. It sets
// s.HostIfIndex to the new host end's.
//
// It refuses, changing nothing, when the namespace is not s's (an error
// wrapping [ErrGone]), when a host link of the slot's name is there
// already, or an interface of the inside end's name inside: a slot it
// cannot put back is the caller's to quarantine, never to tear down
// while something lives in it.
func (m *Manager) RecreateHost(ctx context.Context, s *Slot) error {
	if err := m.checkIndex(s.Index); err != nil {
		return err
	}
	cur, err := m.boundSlot(s.Index)
	if err != nil {
		return err
	}
	if cur.NetnsID != s.NetnsID {
		return fmt.Errorf("slot %d: the namespace at %s is not the one recorded: %w", s.Index, s.NetnsPath, ErrGone)
	}
	if idx, err := linkIndex(s.HostIf); err != nil {
		return fmt.Errorf("slot %d: %w", s.Index, err)
	} else if idx != 0 {
		return fmt.Errorf("slot %d: a host link %s is there already (index %d): not put back over it", s.Index, s.HostIf, idx)
	}
	fd, err := netns.Open(s.NetnsPath)
	if err != nil {
		return fmt.Errorf("slot %d: %w", s.Index, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || (netns.ID{Dev: st.Dev, Ino: st.Ino}) != s.NetnsID {
		return fmt.Errorf("slot %d: the namespace opened at %s is not the one recorded (%v): %w", s.Index, s.NetnsPath, err, ErrGone)
	}
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		return fmt.Errorf("slot %d: netlink handle in %s: %w", s.Index, s.NetnsName, err)
	}
	_, err = h.LinkByName(s.InsideIf)
	h.Close()
	if err == nil {
		return fmt.Errorf("slot %d: an interface %s is inside %s already: not put back over it", s.Index, s.InsideIf, s.NetnsName)
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: s.HostIf, NumTxQueues: 1, NumRxQueues: 1},
		PeerName:      s.InsideIf,
		PeerNamespace: netlink.NsFd(fd),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("slot %d: add veth %s<->%s: %w", s.Index, s.HostIf, s.InsideIf, err)
	}
	undo := func(err error) error {
		if idx, lerr := linkIndex(s.HostIf); lerr == nil && idx != 0 {
			_ = netlink.LinkDel(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: idx, Name: s.HostIf}})
		}
		return fmt.Errorf("slot %d: put the host link back: %w", s.Index, err)
	}
	host, err := netlink.LinkByName(s.HostIf)
	if err != nil {
		return undo(fmt.Errorf("find %s: %w", s.HostIf, err))
	}
	if err := m.addressHostEnd(host, s); err != nil {
		return undo(err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return undo(fmt.Errorf("set %s up: %w", s.HostIf, err))
	}
	if err := m.configureInside(fd, s); err != nil {
		return undo(err)
	}
	if err := m.fw.Add(ctx, s.HostIf); err != nil {
		return undo(err)
	}
	s.HostIfIndex = host.Attrs().Index
	return nil
}

// HostLinkIndex returns the index of slot i's host link in the root
// namespace, 0 when there is none. It only reads.
func (m *Manager) HostLinkIndex(i int) (int, error) {
	if err := m.checkIndex(i); err != nil {
		return 0, err
	}
	return linkIndex(m.cfg.HostIfName(i))
}
