package slot

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// linkProbe answers "does this root-namespace link exist?" with one ioctl
// (SIOCGIFINDEX), without dumping every link through netlink.
type linkProbe struct{ fd int }

func newLinkProbe() (*linkProbe, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("slot: socket for link probe: %w", err)
	}
	return &linkProbe{fd: fd}, nil
}

func (p *linkProbe) close() { unix.Close(p.fd) }

// index returns the link's index, 0 if there is no such link.
func (p *linkProbe) index(name string) (int, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, fmt.Errorf("slot: link %q: %w", name, err)
	}
	if err := unix.IoctlIfreq(p.fd, unix.SIOCGIFINDEX, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return 0, nil
		}
		return 0, fmt.Errorf("slot: ioctl(SIOCGIFINDEX) %s: %w", name, err)
	}
	return int(ifr.Uint32()), nil
}

// linkIndex is index with a probe of its own.
func linkIndex(name string) (int, error) {
	p, err := newLinkProbe()
	if err != nil {
		return 0, err
	}
	defer p.close()
	return p.index(name)
}

// deleteLink deletes a root-namespace link by name; a missing link is fine.
func deleteLink(p *linkProbe, name string) error {
	idx, err := p.index(name)
	if err != nil || idx == 0 {
		return err
	}
	err = netlink.LinkDel(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: idx, Name: name}})
	if err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("slot: delete link %s: %w", name, err)
	}
	return nil
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
