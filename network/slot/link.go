package slot

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/phasegate/phasegate/network/account"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Looking a missing interface up by name with ioctl(SIOCGIFINDEX) makes the
// kernel try to load a module called netdev-<name> (dev_load) for a caller
// holding CAP_NET_ADMIN, and one called <name> for a caller holding
// CAP_SYS_MODULE: on a host with loadable modules that runs modprobe, twice,
// for every name that is not there. So a name that may be missing is looked
// up without those capabilities (indexNoLoad), and the teardown wait polls
// by index with ioctl(SIOCGIFNAME), which never loads anything.

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
// it does not exist. Only for names expected to exist (see above; others go
// through indexNoLoad): it is one
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

// indexNoLoad is index for a name that may not exist: the lookup runs on
// an OS thread of its own with CAP_NET_ADMIN and CAP_SYS_MODULE out of the
// thread's effective set (capabilities are per thread), so that dev_load
// requests no module. The thread gets them back before it runs anything
// else, or, if it cannot, ends with the goroutine that locked it.
func (p *linkProbe) indexNoLoad(name string) (int, error) {
	type result struct {
		index int
		err   error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		restore, err := dropLoadCaps()
		if err != nil {
			runtime.UnlockOSThread() // nothing was changed
			done <- result{err: fmt.Errorf("slot: link %q: %w", name, err)}
			return
		}
		idx, err := p.index(name)
		if restore() == nil {
			runtime.UnlockOSThread()
		}
		done <- result{idx, err}
	}()
	r := <-done
	return r.index, r.err
}

// dropLoadCaps takes CAP_NET_ADMIN and CAP_SYS_MODULE out of the calling
// thread's effective set; restore puts the set back as it was. The caller
// holds the thread locked from before the drop until restore succeeds.
func dropLoadCaps() (restore func() error, err error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var was [2]unix.CapUserData
	if err := unix.Capget(&hdr, &was[0]); err != nil {
		return nil, fmt.Errorf("capget: %w", err)
	}
	less := was
	less[0].Effective &^= 1<<unix.CAP_NET_ADMIN | 1<<unix.CAP_SYS_MODULE
	if err := unix.Capset(&hdr, &less[0]); err != nil {
		return nil, fmt.Errorf("capset: %w", err)
	}
	return func() error {
		if err := unix.Capset(&hdr, &was[0]); err != nil {
			return fmt.Errorf("capset: %w", err)
		}
		return nil
	}, nil
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

// up reports whether the link name is administratively up, with
// ioctl(SIOCGIFFLAGS). Like index, only for a name known to exist.
func (p *linkProbe) up(name string) (bool, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return false, fmt.Errorf("slot: link %q: %w", name, err)
	}
	if err := unix.IoctlIfreq(p.fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return false, fmt.Errorf("slot: ioctl(SIOCGIFFLAGS) %s: %w", name, err)
	}
	return ifr.Uint16()&unix.IFF_UP != 0, nil
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

// listLinks reads the links in the calling thread's network namespace
// (the root namespace: no thread that runs Go code ever changes
// namespace) from /proc/thread-self/net/dev: their names, and the
// counters a lease's account reads.
//
// Not from an RTM_GETLINK dump: for every veth whose peer is in another
// namespace, the kernel puts IFLA_LINK_NETNSID in the dump, and looks that id
// up with a linear walk of the root namespace's nsid table, which holds one
// entry per slot, so a dump of N slots' links costs O(N²) (figures:
// docs/BENCHMARKS.md). /proc/net/dev walks the devices by ifindex and
// prints counters only: linear.
//
// Like any listing it is a snapshot, and callers treat it as a hint
// (Teardown probes each link it acts on; the reconciler's next pass sees
// what a scan missed).
func listLinks() (*account.NetDev, error) {
	d, err := account.ReadNetDev()
	if err != nil {
		return nil, fmt.Errorf("slot: list links: %w", err)
	}
	return d, nil
}

// name returns the name of the root-namespace link index, or
// "ifindex <n>" when it cannot be read (gone meanwhile): for messages and
// for telling our links from others, never for acting on one.
func (p *linkProbe) name(index int) string {
	ifr, err := unix.NewIfreq("")
	if err == nil {
		ifr.SetUint32(uint32(index))
		if err = unix.IoctlIfreq(p.fd, unix.SIOCGIFNAME, ifr); err == nil {
			return ifr.Name()
		}
	}
	return fmt.Sprintf("ifindex %d", index)
}
