package slot

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
)

// ErrGone is wrapped by [Manager.Lookup] when a slot's objects are not all
// on the host: its namespace file is missing or holds no namespace, or its
// host link is missing.
var ErrGone = errors.New("slot objects gone")

// Lookup describes slot i as it is on the host now, with the identity of
// its objects (the namespace bound at its netns file, its host link's
// index), so that a caller can tell whether they are still the ones it
// recorded: a namespace or link made again under the same name has another
// identity. It only reads: nothing on the host changes. A slot whose
// objects are not all there gives an error wrapping [ErrGone] that says
// which is missing.
func (m *Manager) Lookup(i int) (*Slot, error) {
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
	idx, err := linkIndex(s.HostIf)
	if err != nil {
		return nil, fmt.Errorf("slot %d: %w", i, err)
	}
	if idx == 0 {
		return nil, fmt.Errorf("slot %d: host link %s: %w", i, s.HostIf, ErrGone)
	}
	s.HostIfIndex = idx
	return &s, nil
}

// RepairHost puts back what the host link of slot s needs to carry traffic,
// touching nothing inside its namespace: the link up and its address. It
// returns what it had to repair (nothing, for a slot found as it was
// left). A workload inside keeps running throughout. The slot's firewall
// element is the caller's: one [nft.Table.Add] for all the slots it
// restores.
func (m *Manager) RepairHost(s *Slot) (repaired []string, err error) {
	link, err := netlink.LinkByIndex(s.HostIfIndex)
	if err != nil {
		return nil, fmt.Errorf("slot %d: host link %s (index %d): %w", s.Index, s.HostIf, s.HostIfIndex, err)
	}
	if link.Attrs().Name != s.HostIf {
		return nil, fmt.Errorf("slot %d: link index %d is %s, not %s: %w", s.Index, s.HostIfIndex, link.Attrs().Name, s.HostIf, ErrGone)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
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
	return repaired, nil
}
