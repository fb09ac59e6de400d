package slot

import (
	"context"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
)

// ErrHostLinkThere is wrapped by [Manager.Relink] when the slot's host
// link exists: there is nothing to make again (it came back, or another
// caller made it).
var ErrHostLinkThere = errors.New("host link there")

// Relink makes slot s's veth pair again after its host end was deleted
// from outside the daemon (`ip link del`), which deletes the pair, while
// its namespace is intact: the one bound at its netns file is still
// s.NetnsID. The pair is made as Create makes it, its inside end created
// in the namespace under its own name; then the host end's address, IPv6
// off and the link up, the inside end's address, up, and the default
// route through it, the guest device's forwarding where the slot has one
// (the parts RepairGuest finds missing), and the firewall element. Nothing
// else inside the namespace is touched: a workload living there keeps
// running and gets its network back. It returns the new host end's index,
// which the caller records; s is not changed.
//
// A namespace that is gone or not the recorded one wraps [ErrGone]; a
// host link of the slot's name that exists wraps [ErrHostLinkThere]. A
// step that fails after the pair is made deletes the pair again, so that
// a later call starts from the same state.
func (m *Manager) Relink(ctx context.Context, s *Slot) (int, error) {
	if err := m.checkIndex(s.Index); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("slot %d: relink: %w", s.Index, err)
	}
	fd, err := netns.Open(s.NetnsPath)
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, netns.ErrNotNamespace):
		return 0, fmt.Errorf("slot %d: relink: namespace %s: %w", s.Index, s.NetnsPath, ErrGone)
	case err != nil:
		return 0, fmt.Errorf("slot %d: relink: %w", s.Index, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("slot %d: relink: fstat %s: %w", s.Index, s.NetnsPath, err)
	}
	if (netns.ID{Dev: st.Dev, Ino: st.Ino}) != s.NetnsID {
		return 0, fmt.Errorf("slot %d: relink: the namespace at %s is not the one recorded: %w", s.Index, s.NetnsPath, ErrGone)
	}
	switch idx, err := linkIndex(s.HostIf); {
	case err != nil:
		return 0, fmt.Errorf("slot %d: relink: %w", s.Index, err)
	case idx != 0:
		return 0, fmt.Errorf("slot %d: relink: %s is there (index %d): %w", s.Index, s.HostIf, idx, ErrHostLinkThere)
	}
	// As Create makes it: one queue each way (see create), the inside end
	// made in the namespace, never moved into it.
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: s.HostIf, NumTxQueues: 1, NumRxQueues: 1},
		PeerName:      s.InsideIf,
		PeerNamespace: netlink.NsFd(fd),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return 0, fmt.Errorf("slot %d: relink: add veth %s<->%s: %w", s.Index, s.HostIf, s.InsideIf, err)
	}
	idx, err := m.configureRelinked(ctx, fd, s)
	if err != nil {
		if derr := deleteHostLink(s.HostIf); derr != nil {
			err = errors.Join(err, derr)
		}
		return 0, fmt.Errorf("slot %d: relink: %w", s.Index, err)
	}
	return idx, nil
}

// configureRelinked gives the pair Relink made what Create gives a new
// slot's, and returns the host end's index.
func (m *Manager) configureRelinked(ctx context.Context, fd int, s *Slot) (int, error) {
	host, err := netlink.LinkByName(s.HostIf)
	if err != nil {
		return 0, fmt.Errorf("find %s: %w", s.HostIf, err)
	}
	if err := m.addressHostEnd(host, s); err != nil {
		return 0, err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return 0, fmt.Errorf("set %s up: %w", s.HostIf, err)
	}
	if err := m.configureInside(fd, s); err != nil {
		return 0, err
	}
	if m.cfg.Guest.Enabled() {
		if _, err := m.repairGuest(fd, s); err != nil {
			return 0, err
		}
	}
	if err := m.fw.Add(ctx, s.HostIf); err != nil {
		return 0, err
	}
	return host.Attrs().Index, nil
}

// deleteHostLink deletes the root-namespace link name, if there is one.
func deleteHostLink(name string) error {
	idx, err := linkIndex(name)
	if err != nil || idx == 0 {
		return err
	}
	p, err := newLinkProbe()
	if err != nil {
		return err
	}
	defer p.close()
	return deleteLink(p, idx, name)
}
