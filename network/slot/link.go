package slot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
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

// index returns the index of a link by name with ioctl(SIOCGIFINDEX), 0 if
// it does not exist. Only for names expected to exist (see above): it is one
// RCU lookup, where a netlink request would queue behind the RTNL lock that
// the kernel holds while it destroys namespaces.
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

// listLinks returns all root-namespace links (index and name) with one
// RTM_GETLINK dump, parsing only the index and IFLA_IFNAME (the library's
// LinkList decodes every attribute, which costs more than the dump itself
// with thousands of links). A dump the kernel reports as interrupted (links
// changed meanwhile) is retried once, then taken as it is: callers treat the
// listing as a hint (Teardown looks up what it misses; the reconciler's next
// pass sees what a scan missed).
func listLinks() ([]hostLink, error) {
	var (
		msgs [][]byte
		err  error
	)
	for range 2 {
		req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_DUMP)
		req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
		msgs, err = req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("slot: list links: %w", err)
	}
	out := make([]hostLink, 0, len(msgs))
	for _, m := range msgs {
		if len(m) < unix.SizeofIfInfomsg {
			continue
		}
		index := int(int32(binary.NativeEndian.Uint32(m[4:8])))
		for b := m[unix.SizeofIfInfomsg:]; len(b) >= unix.SizeofRtAttr; {
			l := int(binary.NativeEndian.Uint16(b[0:2]))
			t := binary.NativeEndian.Uint16(b[2:4])
			if l < unix.SizeofRtAttr || l > len(b) {
				break
			}
			if t == unix.IFLA_IFNAME {
				name := b[unix.SizeofRtAttr:l]
				if i := bytes.IndexByte(name, 0); i >= 0 {
					name = name[:i]
				}
				out = append(out, hostLink{index: index, name: string(name)})
				break
			}
			b = b[min((l+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1), len(b)):]
		}
	}
	return out, nil
}
