package slot

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Looking a missing interface up by name with ioctl(SIOCGIFINDEX) makes the
// kernel try to load a module called netdev-<name> (dev_load): on a host with
// loadable modules that spawns modprobe for every vanished link. So names are
// resolved through netlink, and the teardown wait polls by index with
// ioctl(SIOCGIFNAME), which never loads anything.

// linkProbe polls root-namespace links by index with one ioctl each.
type linkProbe struct{ fd int }

func newLinkProbe() (*linkProbe, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("slot: socket for link probe: %w", err)
	}
	return &linkProbe{fd: fd}, nil
}

func (p *linkProbe) close() { unix.Close(p.fd) }

// exists reports whether link index still exists with the given name (an
// index is never reused quickly, but check the name anyway).
func (p *linkProbe) exists(index int, name string) (bool, error) {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return false, err
	}
	ifr.SetUint32(uint32(index))
	if err := unix.IoctlIfreq(p.fd, unix.SIOCGIFNAME, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return false, nil
		}
		return false, fmt.Errorf("slot: ioctl(SIOCGIFNAME) %d: %w", index, err)
	}
	return ifr.Name() == name, nil
}

// linkIndex returns the index of the root-namespace link name, 0 if there
// is none.
func linkIndex(name string) (int, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
			return 0, nil
		}
		return 0, fmt.Errorf("slot: find link %s: %w", name, err)
	}
	return l.Attrs().Index, nil
}

// deleteLink deletes a root-namespace link by index, checking its name
// first; a missing link is fine.
func deleteLink(p *linkProbe, index int, name string) error {
	if ok, err := p.exists(index, name); err != nil || !ok {
		return err
	}
	err := netlink.LinkDel(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: index, Name: name}})
	if err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("slot: delete link %s: %w", name, err)
	}
	return nil
}

// hostLink is a root-namespace link known by index and name.
type hostLink struct {
	index int
	name  string
}

// listLinks returns the names of all root-namespace links, retrying a dump
// the kernel reports as interrupted.
func listLinks() ([]string, error) {
	var (
		links []netlink.Link
		err   error
	)
	for range 5 {
		links, err = netlink.LinkList()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("slot: list links: %w", err)
	}
	names := make([]string, 0, len(links))
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	return names, nil
}
