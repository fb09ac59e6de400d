package shape

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// DeleteIfbs deletes the ifbs named names, the slots' of one teardown
// batch, in one RTM_DELLINK: deleting a link waits for the kernel's RCU
// grace periods (tens of milliseconds, with the rtnl lock held), and the
// kernel pays them once for every device of one deletion by group
// (unregister_netdevice_many), once per device otherwise. A missing name
// is fine and a link of the name that is no ifb is left alone, as for
// [DeleteIfb]. It answers the names it could not delete, each with why;
// none when all went.
//
// The ifbs are moved into a link group no other link is in, checked
// after the move, and the group is deleted. Should another link turn up
// in the group, or the kernel refuse a step, each ifb is deleted alone.
func DeleteIfbs(names []string) map[string]error {
	ifbs, failed := ifbsNamed(names)
	if len(ifbs) < 2 {
		deleteEach(ifbs, failed)
		return failed
	}
	group := 1<<24 + rand.Uint32N(1<<30) // far from 0 (the default) and the small numbers people pick
	var moved []netlink.Link
	for _, l := range ifbs {
		if err := netlink.LinkSetGroup(l, int(group)); err != nil {
			deleteEach([]netlink.Link{l}, failed)
			continue
		}
		moved = append(moved, l)
	}
	if err := deleteGroup(group, moved); err != nil {
		deleteEach(moved, failed)
	}
	return failed
}

// ifbsNamed looks the names up: the ifbs among them, and the lookups that
// failed other than for a missing link.
func ifbsNamed(names []string) ([]netlink.Link, map[string]error) {
	failed := map[string]error{}
	var ifbs []netlink.Link
	for _, name := range names {
		l, err := netlink.LinkByName(name)
		var nf netlink.LinkNotFoundError
		switch {
		case errors.As(err, &nf):
		case err != nil:
			failed[name] = fmt.Errorf("shape: %s: get link: %w", name, err)
		default:
			if _, ok := l.(*netlink.Ifb); ok {
				ifbs = append(ifbs, l)
			}
		}
	}
	return ifbs, failed
}

// deleteEach deletes each of ifbs alone, noting failures in failed.
func deleteEach(ifbs []netlink.Link, failed map[string]error) {
	for _, l := range ifbs {
		name := l.Attrs().Name
		if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			failed[name] = fmt.Errorf("shape: %s: delete ifb: %w", name, err)
		}
	}
}

// deleteGroup deletes link group group, once the group is seen to hold
// nothing but ours.
func deleteGroup(group uint32, ours []netlink.Link) error {
	links, err := linkList()
	if err != nil {
		return err
	}
	mine := make(map[int]bool, len(ours))
	for _, l := range ours {
		mine[l.Attrs().Index] = true
	}
	for _, l := range links {
		if a := l.Attrs(); uint32(a.Group) == group && !mine[a.Index] {
			return fmt.Errorf("shape: link group %d holds %s, not an ifb of this batch", group, a.Name)
		}
	}
	req := nl.NewNetlinkRequest(unix.RTM_DELLINK, unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(group)))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("shape: delete link group %d: %w", group, err)
	}
	return nil
}

// linkList lists the host's links, again when the kernel says a dump was
// interrupted (links came or went meanwhile, as in a teardown): a partial
// list could miss the link that forbids the group's deletion.
func linkList() ([]netlink.Link, error) {
	var err error
	for range 5 {
		var links []netlink.Link
		if links, err = netlink.LinkList(); err == nil {
			return links, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return nil, fmt.Errorf("shape: list links: %w", err)
}
